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


@pytest.fixture
def small_bulk(monkeypatch):
    """Guided runs from 256 bulk rows (1,024 by default): a ~700-token document keeps each request short."""
    monkeypatch.setattr("backend.ridgefill.plan.MIN_BULK", 256)


def needles_doc(chars: int = 1800) -> DocumentText:
    """Paragraphs of the shipped corpus with the three facts at a quarter, a half and three quarters."""
    paras = [p for p in corpus_texts()[0][:chars].split("\n\n") if p.strip()]
    q = len(paras) // 4
    facts = list(FACTS.values())
    parts = paras[:q] + [facts[0]] + paras[q : 2 * q] + [facts[1]] + paras[2 * q : 3 * q] + [facts[2]] + paras[3 * q :]
    return DocumentText("harbour.txt", "\n\n".join(parts))


def ask(engine, doc: DocumentText, question: str, mode: str):
    request = CompletionRequest(messages=document_messages([doc], question), max_tokens=4, mode=mode,
                                reuse_prefix=False, documents=[doc])
    return complete(engine, request), engine.prompt_tokens(request)


def test_guided_spans_point_at_its_exact_rows_and_cover_the_asked_needle(small_engine, small_bulk):
    doc = needles_doc()
    covered = 0
    for question, fact in FACTS.items():
        result, tokens = ask(small_engine, doc, question, "guided")
        assert result.timings.mode == "guided" and result.timings.exact_n > 0, result.timings.note
        spans = [s.as_dict() for s in result.exact_spans]
        assert spans and all(set(s) == {"document", "start", "end"} for s in spans)
        assert all(s["document"] == "harbour.txt" and 0 <= s["start"] < s["end"] <= len(doc.text) for s in spans)
        assert all(a["end"] < b["start"] for a, b in zip(spans, spans[1:]))  # in order, adjacent rows merged
        assert all(doc.text[s["start"]:s["end"]] == doc.text[s["start"]:s["end"]].strip() for s in spans)
        assert sum(s["end"] - s["start"] for s in spans) < len(doc.text.strip())  # not the whole document
        # every row whose text starts inside a span is exact in the row record, and every exact row is inside one
        (placed,) = place_documents(small_engine, tokens, [doc])
        approximated = set(small_engine.slot.record.approximated(0, len(tokens)))
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


def test_an_exact_run_sends_no_spans(small_engine, small_bulk):
    result, _ = ask(small_engine, needles_doc(), next(iter(FACTS)), "off")
    assert result.timings.mode == "off" and result.exact_spans == []
    assert result.sources  # the answer still has its sources: only the shading is left out
