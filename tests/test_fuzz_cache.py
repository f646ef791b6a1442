"""A Hypothesis fuzz test of one prompt cache entry (tests/fuzz_cache.py does the mutating): a header,
state or split streams mutated, truncated or given values of the wrong type loads whole or is refused
(EntryRefused), never another exception. The long run: `python -m tests.fuzz_cache 100000`."""
from __future__ import annotations

import random
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_cache import fuzz_cache_entries, mutate_entry, template, try_entry


@pytest.fixture(scope="module")
def templates():
    """A few valid entries (exact, approximated, with split streams) and a folder to try them in."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "prompts"
        rnd = random.Random(7)
        yield root, [template(root, rnd) for _ in range(8)]


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(rnd=st.randoms(use_true_random=False), which=st.integers(0, 7))
def test_a_mutated_entry_loads_whole_or_is_refused(templates, rnd, which):
    root, entries = templates
    entry, files = entries[which]
    assert try_entry(root, entry, mutate_entry(files, rnd)) in ("loaded", "refused", "absent")


def test_the_unmutated_templates_load(templates):
    """The control: without damage every template is listed and loads."""
    root, entries = templates
    assert all(try_entry(root, entry, files) == "loaded" for entry, files in entries)


def test_the_long_run_entry_point_counts_inputs_and_crashes():
    figures = fuzz_cache_entries(100, seed=3)
    assert figures["inputs"] == 100 and figures["crashes"] == {}, figures["examples"]
    assert figures["outcomes"].get("refused", 0) > 25 and figures["peak_rss_mb"] > 0
