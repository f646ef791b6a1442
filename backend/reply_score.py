"""A reply scored on the cache sequence 0 holds: the log-probability of each of its tokens, teacher-forced
after the prompt. The fidelity evaluations and the answer check (answer_check.py) measure with it."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .errors import Cancelled


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def score_after_head(engine, scored: list[int], pos: int, cancel: Callable[[], bool] | None = None) -> np.ndarray:
    """log p of each `scored` token, the head (`pos` rows) cached and its last logits ready."""
    last_n = len(scored)
    out = np.empty(last_n, dtype=np.float64)
    out[0] = log_softmax(engine.last_logits())[scored[0]]
    n_batch, done = engine.config.n_batch, 1
    while done < last_n:  # feed scored[:-1]; row i predicts scored[i + 1]
        if cancel is not None and cancel():
            raise Cancelled("scoring cancelled")
        chunk = scored[done - 1 : min(done - 1 + n_batch, last_n - 1)]
        engine.slot.decode(chunk, pos, logits_last=True, logits_all=True)
        lp = log_softmax(engine.row_logits(len(chunk)))
        out[done : done + len(chunk)] = lp[np.arange(len(chunk)), scored[done : done + len(chunk)]]
        pos += len(chunk)
        done += len(chunk)
    return out


def reply_nll(engine, prompt: list[int], reply: list[int], cancel: Callable[[], bool] | None = None) -> float | None:
    """Mean NLL (nats per token) of `reply` teacher-forced after `prompt`, on the cache sequence 0 holds
    for the prompt (its last row is decoded again, exact, to give the first reply token's logits); None
    for no reply. Sequence 0 then holds the prompt and the reply but its last token."""
    if not reply:
        return None
    engine.slot.truncate(len(prompt) - 1)
    engine.slot.decode(prompt[-1:], len(prompt) - 1, logits_last=True)
    return float(-score_after_head(engine, reply, len(prompt), cancel).mean())
