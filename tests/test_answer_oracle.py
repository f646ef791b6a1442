"""The recall eval's oracle ("guided+answer"): guided with the asked answer's rows made exact as well, and
each guided line saying whether the answer's rows were made exact (the hit on that very item)."""
from __future__ import annotations

from dataclasses import replace

from backend.documents import document_messages
from backend.protocol import CompletionRequest
from backend.recall.document_questions import answer_rows, questions_dir
from backend.recall.needles import Needle, NeedleItem
from backend.recall.run import answer_plan, run_item
from backend.ridgefill.plan import plan_prefill


def _item(engine) -> NeedleItem:
    text = (questions_dir() / "realqa-gnupg-readme-part1.txt").read_text(encoding="utf-8")
    messages = document_messages(text, "Which RFC defines the OpenPGP standard?")
    tokens = engine.prompt_tokens(CompletionRequest(messages=messages))
    start, end = answer_rows(engine, messages, tokens, "RFC4880")
    needle = Needle(key="RFC", value="RFC4880", start=start, end=end, asked=True)
    return NeedleItem(id="t/0", variant="question", length=len(tokens), depth=start / len(tokens), haystack="t",
                      seed=0, rep=0, key="RFC4880", answers=["RFC4880", "RFC 4880"], needles=[needle],
                      messages=messages, max_tokens=8)


def test_the_oracle_makes_the_answers_rows_exact_and_nothing_else_it_was_not_asked(small_engine):
    item = _item(small_engine)
    request = item.request("guided")
    plan = answer_plan(small_engine, item, request)
    rows = set(range(item.needles[0].start, item.needles[0].end))
    assert set(plan.guided.also_rows) == rows and rows
    # the question's own choice off (no places): only the answer's rows are made exact
    nothing_chosen = replace(plan, guided=replace(plan.guided, peaks=0, also_peaks=0))
    from backend.completion import complete

    result = complete(small_engine, request, plan=nothing_chosen)
    record = small_engine.slot.record
    assert result.timings.exact_n == len(rows)
    assert not record.approximated(min(rows), max(rows) + 1) and record.approximated(0, min(rows))
    # without it, the same plan leaves them approximated
    complete(small_engine, request, plan=replace(nothing_chosen, guided=replace(nothing_chosen.guided, also_rows=())))
    assert small_engine.slot.record.approximated(min(rows), max(rows) + 1)


def test_guided_lines_say_whether_the_answers_rows_were_made_exact(small_engine):
    item = _item(small_engine)
    oracle = run_item(small_engine, item, "guided+answer", None, None)
    assert oracle["mode"] == "guided+answer" and oracle["mode_run"] == "guided" and oracle["answer_exact"] is True
    assert "answer_exact" not in run_item(small_engine, item, "off", None, None)
    assert plan_prefill(small_engine, item.request("guided"), item.length).guided.also_rows == ()  # requests: never
