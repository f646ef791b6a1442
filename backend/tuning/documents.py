"""The documents tune judges a setting on: the long set's judge half (real manuals, a specification, a
guide, an FAQ, a licence, which no shipped default was chosen on), each cut to its head of at most
`doc_tokens` tokens at a line's end, with a few of its questions whose answer lies in the kept text,
spread over it. Fidelity measures how far a setting moves exact's own reply, right or wrong, so a cut
document still judges it; the cut bounds the time (docs/TUNE.md).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..errors import DocumentError
from ..ridgefill.defaults import MIN_BULK
from .fidelity import MAX_TOKENS, item_request, parse_setting
from .question_files import JUDGE, DocumentQuestion, QuestionedDocument, long_set

# Each judge-half document cut to 8K tokens, four questions each: Gemma 3 270M's tune takes 16 minutes on
# two threads (docs/TUNE.md)
DOC_TOKENS = 8192
PER_DOC = 4
# An engine slower a token than Gemma 3 270M on two threads (2.0 ms a token over PROBE_TOKENS exact;
# SmolLM2-135M 4.7: docs/TUNE.md) gets its documents cut as much shorter, so that its tune keeps to the
# same time; never below MIN_DOC_TOKENS
REFERENCE_S_PER_TOKEN = 0.0020
PROBE_TOKENS = 2048
MIN_DOC_TOKENS = 2048


def seconds_per_token(engine) -> float:
    """This engine's exact prefill time a token, on PROBE_TOKENS of the shipped prose (a short decode
    first: the context's one-off set-up is not a token's cost)."""
    from ..corpus import corpus_texts

    tokens = engine.tokenize(" ".join(corpus_texts()))[:min(PROBE_TOKENS, engine.n_ctx - 64)]
    with engine.scratch():
        engine.slot.prefill(tokens[:64], reuse_prefix=False)
        engine.slot.truncate(0)
        t0 = time.perf_counter()
        engine.slot.prefill(tokens, reuse_prefix=False)
        return (time.perf_counter() - t0) / len(tokens)


def sample_tokens(s_per_token: float, budget_s: float, default_budget_s: float) -> int:
    """How long a cut document may be for a tune of `budget_s` on an engine this fast a token."""
    scale = REFERENCE_S_PER_TOKEN / s_per_token * budget_s / default_budget_s
    return max(MIN_DOC_TOKENS, min(DOC_TOKENS, int(DOC_TOKENS * scale) // 256 * 256))


@dataclass
class TuneDocuments:
    documents: list[QuestionedDocument]  # shortest first: a setting that departs fails on the cheapest
    tokens: dict[str, int]  # each document's prompt tokens (its first question's)
    left_out: dict[str, str]  # document -> why it was left out


def tune_documents(engine, tail: int, doc_tokens: int = DOC_TOKENS, per_doc: int = PER_DOC,
                   names: list[str] | None = None) -> TuneDocuments:
    """The judge half's documents as the engine holds them (`names`: only these)."""
    room = min(doc_tokens, getattr(engine, "n_ctx_max", engine.n_ctx) - MAX_TOKENS - 64)
    kept, tokens, left_out = [], {}, {}
    for doc in long_set(JUDGE):
        if names and doc.name not in names:
            continue
        try:
            cut = _cut(engine, doc, room)
        except DocumentError as exc:
            left_out[doc.name] = str(exc)
            continue
        questions = spread([q for q in doc.questions if 0 <= answer_at(doc.text, q) < len(cut.text)], per_doc)
        if not questions:
            left_out[doc.name] = f"no question's answer lies in its first {room:,} tokens"
            continue
        n = len(engine.prompt_tokens(item_request(replace(cut, questions=questions), questions[0].question,
                                                  parse_setting("off"))))
        if n - tail < MIN_BULK:
            left_out[doc.name] = f"{n:,} tokens: too short for RidgeFill to run at tail {tail}"
            continue
        kept.append(replace(cut, questions=questions))
        tokens[doc.name] = n
    return TuneDocuments(sorted(kept, key=lambda d: tokens[d.name]), tokens, left_out)


def answer_at(text: str, q: DocumentQuestion) -> int:
    """Where the question's answer first lies in `text` (after its `after`, where given); -1: nowhere."""
    if not q.answers:
        return -1
    start = text.find(q.after) if q.after else 0
    if start < 0:  # the anchor was cut away: the answer asked lies beyond it
        return -1
    at = text.find(q.answers[0], start)
    return at if at >= 0 else text.lower().find(q.answers[0].lower(), start)


def spread(questions: list[DocumentQuestion], k: int) -> list[DocumentQuestion]:
    """k of `questions` spread over them: the j-th at (j + 1/2) / k of the list."""
    k = min(k, len(questions))
    return [questions[int((j + 0.5) * len(questions) / k)] for j in range(k)]


def _cut(engine, doc: QuestionedDocument, room: int) -> QuestionedDocument:
    """`doc` cut at a line's end so that its longest question's prompt fits `room` tokens."""
    text = doc.text
    longest = max(doc.questions, key=lambda q: len(q.question)).question
    for _ in range(8):
        n = len(engine.prompt_tokens(item_request(replace(doc, text=text), longest, parse_setting("off"))))
        if n <= room:
            return replace(doc, text=text)
        keep = int(len(text) * room / n * 0.97)
        text = text[: text.rfind("\n", 0, keep) + 1 or keep]
    raise DocumentError(f"{doc.name}: cannot cut it to {room:,} tokens")
