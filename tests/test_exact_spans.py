"""The document text RidgeFill made exact, returned with the answer: real guided requests on the embedded
model (the shipped maps), checked against the row record and the asked needles; `off` returns none."""
from __future__ import annotations

import pickle

import pytest

from backend.completion import complete
from backend.corpus import corpus_texts
from backend.documents import DocumentText, document_messages
from backend.protocol import CompletionRequest
from backend.sources import place_documents

FACTS = {
    "Who is the lighthouse keeper of Port Ellis?": "The lighthouse keeper of Port Ellis is named Marta Quillfeather.",
    "When does the ferry to Saltmere leave?": "The ferry to Saltmere leaves at seven minutes past nine.",
    "What colour is the harbour master's boat?": "The harbour master's boat is painted a deep plum colour.",
}
BUDGET = 128


@pytest.fixture(scope="module")
def engine(model_path):
    """The embedded model on one thread: on a small shared machine a spinning second thread only slows it."""
    from backend.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(model_path, n_ctx=2048, n_threads=1, n_batch=256, n_ubatch=256))
    yield eng
    eng.close()


@pytest.fixture
def small_bulk(monkeypatch):
    """Guided at a small document's scale, so each request is short: it runs from 256 bulk rows (1,024 by
    default) and takes up to 128 rows (512 by default, which would make nearly all of a 550-row bulk exact)."""
    from functools import partial

    from backend.ridgefill.guided import GuidedParams

    monkeypatch.setattr("backend.ridgefill.plan.MIN_BULK", 256)
    monkeypatch.setattr("backend.ridgefill.plan.GuidedParams", partial(GuidedParams, budget=BUDGET))


def needles_doc(chars: int = 2400) -> DocumentText:
    """The shipped corpus's first text with the three facts after the sentences a quarter, half and three
    quarters in (the prompt's first rows are never guided's picks: a fact there would say nothing)."""
    text = corpus_texts()[0][:chars]
    for share, fact in reversed(list(zip((0.25, 0.5, 0.75), FACTS.values()))):
        at = text.index(". ", int(share * len(text))) + 2
        text = text[:at] + fact + " " + text[at:]
    return DocumentText("harbour.txt", text)


def ask(engine, doc: DocumentText, question: str, mode: str):
    request = CompletionRequest(messages=document_messages([doc], question), max_tokens=4, mode=mode,
                                reuse_prefix=False, documents=[doc])
    return complete(engine, request), engine.prompt_tokens(request)


def test_guided_spans_point_at_its_exact_rows_and_cover_the_asked_needle(engine, small_bulk):
    doc = needles_doc()
    covered = 0
    for question, fact in FACTS.items():
        result, tokens = ask(engine, doc, question, "guided")
        assert result.timings.mode == "guided" and result.timings.exact_n > 0, result.timings.note
        spans = [s.as_dict() for s in result.exact_spans]
        assert spans and all(set(s) == {"document", "start", "end"} for s in spans)
        assert all(s["document"] == "harbour.txt" and 0 <= s["start"] < s["end"] <= len(doc.text) for s in spans)
        assert all(a["end"] < b["start"] for a, b in zip(spans, spans[1:]))  # in order, adjacent rows merged
        assert all(doc.text[s["start"]:s["end"]] == doc.text[s["start"]:s["end"]].strip() for s in spans)
        # not the whole document: what the budget allows, so that covering the needle says something
        assert result.timings.exact_n <= BUDGET + 80
        assert sum(s["end"] - s["start"] for s in spans) < 0.6 * len(doc.text), "nearly everything is shaded"
        # every row whose text starts inside a span is exact in the row record, and every exact row is inside one
        (placed,) = place_documents(engine, tokens, [doc])
        approximated = set(engine.slot.record.approximated(0, len(tokens)))
        body_end = len(doc.text.rstrip())
        for k, row in enumerate(placed.rows):
            at, nxt = int(placed.char_of_row[k]), (int(placed.char_of_row[k + 1]) if k + 1 < len(placed.rows)
                                                   else body_end)
            piece = doc.text[at:nxt]
            if not piece.strip():
                continue  # white space only: spans leave it out at their ends
            at += len(piece) - len(piece.lstrip())  # the row's first character that is not white space
            inside = any(s["start"] <= at < s["end"] for s in spans)
            assert inside == (row not in approximated), f"row {row} {piece!r}: shaded {inside}, exact {not inside}"
        at = doc.text.index(fact)
        covered += any(s["start"] <= at and at + len(fact) <= s["end"] for s in spans)
    assert covered >= 2, f"the asked fact's sentence was shaded for {covered} of {len(FACTS)} questions"
    assert pickle.loads(pickle.dumps(result)).exact_spans == result.exact_spans  # it crosses the engine process


def test_an_exact_run_sends_no_spans(engine, small_bulk):
    result, _ = ask(engine, needles_doc(), next(iter(FACTS)), "off")
    assert result.timings.mode == "off" and result.exact_spans == []
    assert result.sources  # the answer still has its sources: only the shading is left out
