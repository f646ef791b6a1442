"""Questions about one document share its rows: each mode's prefill of them is done once and restored.

A question set asks many questions of one document, so every prompt starts with the same rows (the
document) and ends with its own question. Prefilling the document again for each question is most of
an eval's time. Here the shared rows are prefilled once per mode, as that mode's own run of the full
prompt would prefill them, and sequence 0's state is saved; each question loads it and prefills only its
own rows, through the same `complete` as any request:

- `off`: the exact rows, as a prompt cache would give them back;
- a RidgeFill mode: the bulk pass alone (layers below the split run, later layers written from the
  maps), no tail and no row made exact, so each question's own selection starts from nothing, as on a
  fresh prompt (the app keeps an earlier question's exact rows; an eval item must not).

The shared rows end on a whole chunk (`n_batch`), so every decode after it sees the batches a fresh run
of the full prompt sees, and the whole context is saved (slot.snapshot), so every row gets its own cell
back, a sliding-window model's windows too: the answer is the fresh run's, token for token
(tests/test_prefix_snapshot.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ..completion import complete
from ..protocol import CompletionRequest, CompletionResult
from ..ridgefill.injection import prefill_bulk
from ..ridgefill.plan import RidgeFillPlan, plan_prefill
from ..row_record import RowRecord


# Bytes of saved prefills held at once: every document of a question set in two modes (realqa: 16 x 2,
# about 1.3 GB at SmolLM2's 23 KB of K/V per row), whose questions come interleaved so that a stopped
# run covers them all.
MAX_BYTES = 3 << 30


@dataclass
class _Saved:
    state: bytearray
    record: RowRecord


def shared_rows(engine, prompts: list[list[int]], tail: int) -> int:
    """Leading rows every prompt of `prompts` holds, ending on a whole chunk and before any prompt's
    exact tail (`tail` rows: they are never bulk rows)."""
    n = min(len(p) for p in prompts) - tail
    for i, tok in enumerate(prompts[0][:n]):
        if any(p[i] != tok for p in prompts[1:]):
            n = i
            break
    chunk = engine.config.n_batch
    return max(0, n) // chunk * chunk


class PrefixSnapshots:
    """Sequence 0 after each (shared rows, mode) prefill, held in memory for the engine that made it."""

    def __init__(self, engine):
        self.engine = engine
        self._saved: dict[tuple, _Saved] = {}
        self.prefill_s = 0.0  # the last shared prefill's seconds (0 when the last request restored one)

    def complete(self, request: CompletionRequest, shared_n: int, cancel=None, plan=None) -> CompletionResult:
        """`request` (one prompt whose first `shared_n` rows other prompts share) answered from a restored
        prefill of those rows: the same answer as `complete(engine, request)` on a fresh sequence 0.
        `plan`: as complete's."""
        engine = self.engine
        tokens = engine.prompt_tokens(request)
        engine.make_room(len(tokens), request.max_tokens)
        plan = plan or plan_prefill(engine, request, len(tokens))
        tag = plan.tag if isinstance(plan, RidgeFillPlan) else None
        if shared_n <= 0 or (isinstance(plan, RidgeFillPlan) and plan.mode == "plumb"):
            return complete(engine, _fresh(request, False), cancel=cancel, plan=plan)
        key = (tuple(tokens[:shared_n]), request.mode, tag, id(engine.slot))  # a grown context is a new slot
        saved = self._saved.get(key)
        self.prefill_s = 0.0
        if saved is None:
            t0 = time.perf_counter()
            saved = self._prefill(tokens[:shared_n], plan)
            self.prefill_s = time.perf_counter() - t0
            while self._saved and sum(len(s.state) for s in self._saved.values()) + len(saved.state) > MAX_BYTES:
                del self._saved[next(iter(self._saved))]  # the oldest goes (dicts keep insertion order)
            self._saved[key] = saved
        engine.slot.restore_snapshot(saved.state, saved.record)
        return complete(engine, _fresh(request, True), cancel=cancel, plan=plan)

    def _prefill(self, shared: list[int], plan) -> _Saved:
        slot = self.engine.slot
        slot.truncate(0)
        if isinstance(plan, RidgeFillPlan):
            prefill_bulk(self.engine, plan, shared)
        else:
            make_hook = getattr(plan, "cells", None)  # the exact plan's cell recorder (the sources read keys)
            slot.prefill(shared, reuse_prefix=False, hook=make_hook() if make_hook is not None else None)
        return _Saved(*slot.snapshot())


def _fresh(request: CompletionRequest, reuse_prefix: bool) -> CompletionRequest:
    return replace(request, reuse_prefix=reuse_prefix)
