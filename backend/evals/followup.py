"""Follow-up questions in one chat: the second question asks about another fact of the same document.

Each item is a multi-key needle prompt: turn 1 asks the first key; turn 2 (the reply, then a new
question) asks another key whose needle lies in the bulk, reusing the cached prompt as the chat does.
Both turns run exact and in the RidgeFill mode, so the follow-up's TTFT and correctness are paired.
"""
from __future__ import annotations

from dataclasses import replace

from ..completion import complete
from ..protocol import ChatMessage
from .needles import QUESTION, NeedleItem
from .scoring import score


def run_followup(engine, item: NeedleItem, mode: str, split: int | None, tail: int | None) -> dict | None:
    """One item in one mode: {first, follow} each with correct and ttft_ms; None when the follow-up's
    needle is not in the bulk (nothing to test)."""
    second = next((n for n in item.needles if not n.asked), None)
    if second is None or second.end > item.length - (tail or 0):
        return None
    first_req = replace(item.request(mode, split, tail), reuse_prefix=False)
    r1 = complete(engine, first_req)
    messages = list(item.messages) + [ChatMessage("assistant", r1.text.strip()),
                                      ChatMessage("user", QUESTION["number"].format(key=second.key))]
    r2 = complete(engine, replace(first_req, messages=messages, reuse_prefix=True))
    ok1, _ = score(r1.text, item.answers)
    ok2, ans2 = score(r2.text, [second.value])
    return {"id": item.id, "mode": mode, "first_correct": ok1, "follow_correct": ok2, "follow_answer": ans2,
            "first_ttft_ms": round(r1.timings.ttft_ms, 1), "follow_ttft_ms": round(r2.timings.ttft_ms, 1),
            "follow_cache_n": r2.timings.cache_n, "follow_exact_n": r2.timings.exact_n, "note": r2.timings.note}
