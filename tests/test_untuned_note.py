"""A model whose split was measured nowhere (not tuned here, not in the defaults' table) runs RidgeFill at
a guess, and every answer's timings say so; a measured one's do not."""
from __future__ import annotations

from backend.protocol import CompletionRequest
from backend.ridgefill import defaults
from backend.ridgefill.plan import plan_prefill


def _note(engine, split=None) -> str:
    plan = plan_prefill(engine, CompletionRequest(prompt="x", mode="plumb", split=split), 1800)
    return plan.note


def test_a_guessed_split_is_said_and_a_measured_one_is_not(small_engine, monkeypatch):
    assert "untuned" not in _note(small_engine)  # SmolLM2's split is in the table
    monkeypatch.setattr(defaults, "MEASURED_SPLITS", {})
    assert defaults.split_is_guess(small_engine.info)
    note = _note(small_engine)
    assert note.startswith("untuned: split 20 is a guess") and "measured on no document" in note
    assert "untuned" not in _note(small_engine, split=20)  # a split the person chose is theirs
