"""Everything that computes. No Qt here (tests/test_boundaries.py checks it)."""
