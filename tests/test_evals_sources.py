"""The sources eval: each item's document and the spans of its asked facts, what counts as a hit, the table."""
from __future__ import annotations

import pytest

from backend.documents import document_messages
from backend.recall.document_questions import question_items
from backend.recall.haystacks import filler_haystack
from backend.recall.needles import make_items
from lab.commands.sources import spread
from lab.evals.sources import holds, item_document, precision_table, run_sources


def test_a_needle_items_document_is_its_haystack_and_the_span_is_the_asked_needle(small_engine):
    items = make_items(small_engine, lengths=[400], depths=[0.5], variants=["single", "multikey"],
                       haystack=filler_haystack())
    for item in items:
        doc, spans = item_document(item)
        assert doc.text in item.messages[0].content and not doc.text.startswith("Some special magic")
        assert [doc.text[a:b] for a, b in spans] == [f"The special magic number for {n.key} is {n.value}."
                                                     for n in item.asked]
        assert "What is the special magic number" not in doc.text  # the question is not the document


def test_a_question_items_span_is_its_answer_where_the_document_says_it(small_engine):
    item = question_items(small_engine, "realqa")[3]
    doc, [(a, b)] = item_document(item)
    assert doc.text[a:b] == item.answers[0]
    assert document_messages(doc.text, "x")[0].content.startswith("Read this document.")


def test_a_source_holds_a_fact_only_when_it_covers_it_whole():
    assert holds({"start": 10, "end": 60}, [(12, 50)])
    assert not holds({"start": 20, "end": 60}, [(12, 50)])  # cut: half a sentence is not the fact
    assert holds({"start": 0, "end": 5}, [(100, 120), (1, 4)])  # any asked fact


def test_the_table_counts_hits_per_mode_and_group():
    def rec(mode, hay, depth, top, any_):
        return {"mode": mode, "haystack": hay, "length": 2048, "depth": depth, "top": top, "any": any_,
                "top_plain": False, "any_plain": any_, "sources_ms": 10.0, "ttft_ms": 1000.0}
    rows = precision_table([rec("off", "filler", 0.05, True, True), rec("off", "filler", 0.9, False, True),
                            rec("off", "realqa", 0.3, False, False), rec("guided", "filler", 0.05, True, True)])
    by = {(r["mode"], r["group"]): r for r in rows}
    assert (by["off", "all"]["n"], by["off", "all"]["top"], by["off", "all"]["any"]) == (3, 1, 2)
    assert by["off", "haystack filler"]["any"] == 2 and by["off", "depth 0.90"]["top"] == 0
    assert ("off", "depth 0.30") not in by  # a question's depth is not a needle depth
    assert by["guided", "all"]["n"] == 1


def test_spread_takes_evenly_spaced_items():
    assert spread(list(range(10)), 3) == [0, 3, 6] and spread([1, 2], 5) == [1, 2]


@pytest.mark.parametrize("mode", ["off"])  # guided restores cells its passes recorded (test_prefix_snapshot)
def test_questions_about_one_document_get_the_fresh_runs_sources_from_its_restored_prefill(small_engine, tmp_path,
                                                                                           mode):
    items = question_items(small_engine, "realqa")
    two = [i for i in items if i.document == items[1].document][:2]
    fresh = run_sources(small_engine, two, [mode], None, None, tmp_path / "fresh.jsonl", share_documents=False)
    shared = run_sources(small_engine, two, [mode], None, None, tmp_path / "shared.jsonl")
    assert [r["shared_rows"] for r in fresh] == [0, 0] and all(r["shared_rows"] >= 1024 for r in shared)
    assert [r["sources"] for r in shared] == [r["sources"] for r in fresh] and fresh[0]["sources"]
    assert [r["reply"] for r in shared] == [r["reply"] for r in fresh]
