"""The answer after a prefill: tokens drawn one by one by llama.cpp's sampler chain, each decoded onto
sequence 0 through the engine's slot, until the model ends it, a stop string or a loop does
(backend/stopping.py), the room runs out or the user cancels."""
from __future__ import annotations

import codecs
import time
from dataclasses import dataclass

from .protocol import TokenEvent
from .sampler import SamplerChain
from .stopping import AnswerEnd


@dataclass
class Answer:
    tokens: list[int]
    text: str
    finish_reason: str
    first_token_at: float | None  # perf_counter when the first token was drawn


def generate(engine, max_tokens: int, *, sampler: SamplerChain, end: AnswerEnd | None = None,
             on_event=None, cancel=None) -> Answer:
    """Decode after a prefill (the last row's logits ready), each token drawn by `sampler` from them."""
    end = end or AnswerEnd()
    slot = engine.slot
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    out: list[int] = []
    first_token_at = None
    finish, ended = "length", False
    for _ in range(max_tokens):
        if cancel is not None and cancel():
            finish = "cancelled"
            break
        tok = engine.sample(sampler)
        if first_token_at is None:
            first_token_at = time.perf_counter()
        if engine.is_end_of_generation(tok):
            finish = "stop"
            break
        out.append(tok)
        reason = end.feed(decoder.decode(engine.token_bytes(tok)))
        if on_event is not None:
            on_event(TokenEvent(tok, end.shown()))  # never part of a stop string
        if reason is not None:
            finish, ended = reason, True
            break
        if len(slot) >= engine.n_ctx:
            break
        slot.decode([tok], len(slot), logits_last=True)
    if not ended:
        rest = end.finish(decoder.decode(b"", final=True))  # held as a stop string's possible start, or bytes
        if rest and on_event is not None:
            on_event(TokenEvent(-1, rest))
    return Answer(out, end.text, finish, first_token_at)
