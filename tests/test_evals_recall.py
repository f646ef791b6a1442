"""The recall runner on the real embedded model: JSON lines, resume, cancel; and the tail is exact."""
from __future__ import annotations

import json

import pytest

from backend.errors import Cancelled
from backend.recall.haystacks import filler_haystack
from backend.recall.needles import make_items
from backend.recall.run import effective_tail, load_results, run_recall

REQUIRED = {"id", "mode", "length", "depth", "variant", "region", "correct", "reply"}


@pytest.fixture
def counted(small_engine, monkeypatch):
    """The real engine, counting the requests the recall eval has it answer."""
    from backend.recall import run as recall

    calls = []
    real = recall.complete

    def complete(engine, request, **kw):
        calls.append(request)
        return real(engine, request, **kw)

    monkeypatch.setattr(recall, "complete", complete)
    return small_engine, calls


def test_lines_are_written_and_a_rerun_resumes(counted, tmp_path):
    engine, calls = counted
    items = make_items(engine, lengths=[220], depths=[0.3, 0.6, 0.9], variants=["single"], haystack=filler_haystack())
    out = tmp_path / "r.jsonl"
    first = run_recall(engine, items[:2], ["off"], None, 64, out)
    assert len(calls) == 2 and len(first) == 2
    lines = load_results(out)
    assert [r["id"] for r in lines] == [it.id for it in items[:2]]
    for r, it in zip(lines, items):
        assert REQUIRED <= r.keys() and r["length"] == 220 and r["mode"] == "off" and r["kind"] == "recall"
        assert r["needle_pos"] == it.needle_pos and r["region"] == it.region(effective_tail(engine, 220, 64))
        assert isinstance(r["correct"], bool) and r["expected"] == it.answers
    assert all(r["correct"] for r in lines), [r["reply"] for r in lines]  # the model finds these at 220 tokens

    with out.open("a", encoding="utf-8") as f:  # a run killed in the middle of a line
        f.write('{"id": "half a line')
    progress = []
    again = run_recall(engine, items, ["off"], None, 64, out, on_progress=progress.append)
    assert len(calls) == 3 and calls[-1].messages == items[2].messages  # only the new item ran
    assert [p.done for p in progress] == [1, 2, 3] and [p.record is None for p in progress] == [True, True, False]
    assert [r["id"] for r in again] == [it.id for it in items]
    assert [r["id"] for r in load_results(out)] == [it.id for it in items]  # the torn line is skipped
    assert sum(1 for line in out.read_text().splitlines() if line.strip()) == 4

    # A resumed exact line is relabelled for the tail in use (it does not depend on T otherwise).
    relabelled = run_recall(engine, items, ["off"], None, 1, out)
    assert len(calls) == 3
    assert [r["region"] for r in relabelled] == [it.region(effective_tail(engine, 220, 1)) for it in items]


def test_cancel_stops_between_items_and_keeps_what_finished(counted, tmp_path):
    engine, calls = counted
    items = make_items(engine, lengths=[200], depths=[0.2, 0.8], variants=["single"], haystack=filler_haystack())
    out = tmp_path / "c.jsonl"
    finished = []
    with pytest.raises(Cancelled, match="resume"):  # stopped after the first item
        run_recall(engine, items, ["off"], None, 64, out, on_progress=finished.append, cancel=lambda: bool(finished))
    assert len(calls) == 1 and len(load_results(out)) == 1
    json.loads(out.read_text().splitlines()[0])
    with pytest.raises(Cancelled):  # stopped inside the second item's prefill: nothing half-done is saved
        run_recall(engine, items, ["off"], None, 64, out, cancel=lambda: len(calls) >= 2)
    assert len(calls) == 2 and len(load_results(out)) == 1


def test_regions_are_labelled_with_the_rows_that_really_run_exact(small_engine):
    from backend.ridgefill.injection import bulk_rows

    # speed approximates every row with T rows after it; plumb rounds down to whole chunks (256 here)
    assert small_engine.config.n_batch == 256
    assert effective_tail(small_engine, 1600, 512) == 512 and bulk_rows(small_engine, 1600, 512) == 1088
    assert bulk_rows(small_engine, 1600, 512, "plumb") == 1024
    assert effective_tail(small_engine, 1600, None) is None
    assert effective_tail(small_engine, 1500, 512) == 1500  # 988 bulk rows: too few, all of it ran exact


@pytest.mark.slow
def test_needles_in_the_exact_tail_score_the_same_in_off_and_speed(small_engine, tmp_path):
    """At 1,600 tokens with T = 512 there are 1,088 bulk rows (>= MIN_BULK = 1,024, so speed really
    approximates; at 1,024 tokens it would run exact and prove nothing); the needles lie in the tail."""
    from backend.ridgefill.defaults import default_split
    from backend.ridgefill.maps import MapsMissing, find_maps

    split, tail = default_split(small_engine.info), 512
    items = make_items(small_engine, lengths=[1600], depths=[0.9], variants=["single", "multikey"],
                       haystack=filler_haystack())
    assert [it.region(tail) for it in items] == ["tail", "tail"]
    res = run_recall(small_engine, items, ["off", "speed"], split, tail, tmp_path / "t.jsonl")
    by = {(r["id"], r["mode"]): r for r in res}
    assert any(by[(it.id, "off")]["correct"] for it in items)  # the exact model can do the task at all
    for it in items:
        assert by[(it.id, "speed")]["correct"] == by[(it.id, "off")]["correct"], by[(it.id, "speed")]["reply"]
    try:
        find_maps(small_engine.info.path, split)
    except MapsMissing:
        return  # no maps for this split here: speed ran exact, as its note says
    # every row with T rows after it was approximated, none of the tail
    assert all(by[(it.id, "speed")]["bulk_n"] == 1600 - tail for it in items)
    assert all(by[(it.id, "speed")]["mode_run"] == "speed" for it in items)
