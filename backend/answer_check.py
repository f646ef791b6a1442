"""Every fast answer checked against exact's. Once the document is exact (idle_work.py refined every
row RidgeFill approximated), the exact model answers the same request from that cache: one decode of
the prompt's last row and its own answer, no prefill. The two answers are compared as the GUI's Compare
with exact does (the same text, white space aside), and both are teacher-forced on the exact cache: the
shown reply's mean NLL per token minus exact's own reply's (ΔNLL, the quantity docs/LONG_DOCUMENTS.md
measures per document). The same text, or a ΔNLL within the yardstick (WITHIN_NLL: exact finds the
shown reply about as likely as its own), marks the answer "checked"; anything else "corrected", and
exact's answer is shown instead. A refined cache equals a fresh exact prefill up to rounding (its rows
ran in other batches), so a near tie can flip exact's own wording: the yardstick keeps such an answer.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from .answers import answers_agree
from .errors import Cancelled
from .protocol import CompletionRequest, CompletionResult
from .reply_score import reply_nll

CHECKED, CORRECTED = "checked", "corrected"
# Another reply still counts as exact's when exact finds it about as likely as its own: within twice
# q8_0's mean |ΔNLL| on the judge half (0.025 nats/token, docs/LONG_DOCUMENTS.md#maps-that-have-seen-technical-text-2026-12-07),
# the yardstick each document is held to.
WITHIN_NLL = 0.05


@dataclass
class AnswerCheck:
    """The shown (RidgeFill) answer against exact's own, on the exact cache."""

    verdict: str  # CHECKED | CORRECTED
    shown_answer: str
    exact_answer: str
    exact_tokens: list[int]
    dnll: float | None  # NLL of the shown reply minus NLL of exact's reply, both on the exact cache
    seconds: float  # the check itself (exact's answer and both scores)

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("exact_tokens")
        return d


def check_answer(engine, request: CompletionRequest, shown: CompletionResult, cancel=None) -> AnswerCheck:
    """Exact's answer to `request` from the exact cache sequence 0 holds, compared with `shown`.
    Sequence 0 ends as it began (the prompt and the shown answer: what a saved entry of it covers), exact."""
    from .completion import complete

    t0 = time.perf_counter()
    before = engine.slot.tokens
    prompt = engine.prompt_tokens(request)
    exact = complete(engine, replace(request, mode="off", reuse_prefix=True, documents=None), cancel=cancel)
    if exact.finish_reason == "cancelled":
        raise Cancelled("the answer check stopped for a new task")
    exact_nll = reply_nll(engine, prompt, list(exact.tokens), cancel)
    shown_nll = reply_nll(engine, prompt, list(shown.tokens), cancel)
    _decode_rest(engine, before)
    dnll = None if shown_nll is None or exact_nll is None else shown_nll - exact_nll
    same = shown.tokens == exact.tokens or answers_agree(shown.text, exact.text) or (dnll is not None and dnll <= WITHIN_NLL)
    return AnswerCheck(CHECKED if same else CORRECTED, shown.text, exact.text, list(exact.tokens), dnll,
                       round(time.perf_counter() - t0, 3))


def _decode_rest(engine, tokens: list[int]) -> None:
    """Decode what sequence 0 lacks of `tokens` (it holds a prefix of them), exact."""
    held = engine.slot.tokens
    if tokens[: len(held)] != held:
        return
    for start in range(len(held), len(tokens), engine.config.n_batch):
        engine.slot.decode(tokens[start : start + engine.config.n_batch], start)
