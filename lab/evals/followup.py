"""Follow-up questions in one chat: the second question asks about another fact of the same document.

Each item is a multi-key needle prompt: turn 1 asks the first key; turn 2 (the reply, then a new
question) asks another key whose needle lies in the bulk, reusing the cached prompt as the chat does.
Both turns run exact and in the RidgeFill mode, so the follow-up's TTFT and correctness are paired.
"""
from __future__ import annotations

from dataclasses import replace

from backend.completion import complete
from backend.protocol import ChatMessage, CompletionRequest
from backend.recall.needles import ANSWER_CUE, QUESTION, NeedleItem
from backend.recall.scoring import score


def follow_up_request(item: NeedleItem, first: CompletionRequest, first_reply: str, key: str) -> CompletionRequest:
    """The chat after the first answer, asking for `key`'s number: the reply and a new user message,
    or for a base model (item.prompt set) its plain prompt going on after the reply, ending in the
    answer cue for the new key. Prefix reuse on, as the chat does."""
    question = QUESTION["number"].format(key=key)
    if item.prompt is None:
        messages = list(item.messages) + [ChatMessage("assistant", first_reply.strip()), ChatMessage("user", question)]
        return replace(first, messages=messages, reuse_prefix=True)
    prompt = f"{item.prompt}{first_reply.rstrip()}\n\n{question}\n\n{ANSWER_CUE['number'].format(key=key)}"
    return replace(first, prompt=prompt, reuse_prefix=True)


def run_followup(engine, item: NeedleItem, mode: str, split: int | None, tail: int | None) -> dict | None:
    """One item in one mode: {first, follow} each with correct and ttft_ms; None when the follow-up's
    needle is not in the bulk (nothing to test)."""
    second = next((n for n in item.needles if not n.asked), None)
    if second is None or second.end > item.length - (tail or 0):
        return None
    first_req = replace(item.request(mode, split, tail), reuse_prefix=False)
    r1 = complete(engine, first_req)
    r2 = complete(engine, follow_up_request(item, first_req, r1.text, second.key))
    ok1, _ = score(r1.text, item.answers)
    ok2, ans2 = score(r2.text, [second.value])
    return {"id": item.id, "mode": mode, "first_correct": ok1, "follow_correct": ok2, "follow_answer": ans2,
            "first_ttft_ms": round(r1.timings.ttft_ms, 1), "follow_ttft_ms": round(r2.timings.ttft_ms, 1),
            "follow_cache_n": r2.timings.cache_n, "follow_exact_n": r2.timings.exact_n, "note": r2.timings.note}
