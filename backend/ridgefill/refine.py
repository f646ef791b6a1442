"""Refinement in idle time: sequence 0's approximated rows made exact in prompt order, a chunk at a time.

A row decoded after an approximated one saw approximated history, so the cache equals exact's only once
every row from the first unclean one to the end is decoded again, in order: the tail, the answer and
rows guided made exact included. Each chunk is one run through redecode.redecode_exact, on a spare
sequence that shares the rows before it (already exact); a chunk of rows whose stream entering the
split a bulk pass kept runs only the layers from the split on (lower_skip), other rows (the exact tail,
the answer) run through every layer. A chunk of bulk rows runs in refinement's own context
(refine_context), where its attention spans only the rows before it, and its K/V are copied into
sequence 0's cells; others, and any where that context cannot take over the clean prefix, run in
sequence 0's cache. A chunk is a whole ubatch: 512-row chunks refined a 6,000-token prompt 1.9 times
as fast as 64-row ones (docs/measurements/prompt-cache.md#refinement-in-whole-ubatches-stopped-inside-the-decode).
A new task does not wait for a chunk to end: the caller's `abort` check is asked inside the decode (llama.cpp's abort
callback), which stops within a graph node; the stopped chunk leaves nothing and is done again later.

Refinement and guided follow-ups share the row record, each writing it only through the Engine
(mark_exact by redecode_exact; refinement also mark_clean): refinement moves the clean prefix forward;
a follow-up arriving in between reuses what it may (exact rows, and rows approximated under its own
tag), makes the rows its question points to exact (exact, not clean: they saw approximated rows), and
refinement then goes on from the record's first unclean row, wherever the follow-up left it.
"""
from __future__ import annotations

import time

from ..errors import RidgeFillError
from .cache_layout import CellTap
from .lower_skip import SplitStreams
from .redecode import Run, redecode_exact
from .refine_context import RefineContext
from .runtime import runtime

# Fewer free cells than this: too little room to decode rows again beside the old ones.
MIN_CHUNK = 64


class RefineRefused(RidgeFillError):
    """Rows that cannot be made exact here (a sliding-window model, a full context)."""


class Refinement:
    """Makes `engine`'s sequence 0 exact, one `step()` at a time."""

    def __init__(self, engine):
        self.engine = engine
        self.step_s: list[float] = []  # each finished chunk's time (the bench reports them)
        self._context: RefineContext | None = None  # made at the first bulk chunk, closed when all is exact

    @property
    def done(self) -> bool:
        return self.engine.slot.record.all_exact

    def refusal(self) -> str | None:
        """Why the rows cannot be made exact on this engine, or None."""
        rt = runtime(self.engine)
        if rt.windows.has_windows and not rt.windows_kept:
            return ("refinement needs every row's sliding window kept (a full-size sliding-window cache): rows "
                    "decoded again would lose their window")
        free = self.engine.n_ctx - len(self.engine.slot.record)
        if not self.done and free < MIN_CHUNK:
            return f"the context has {free} free cells: too few to decode rows again beside the old ones"
        return None

    def step(self, abort=None) -> int:
        """Decode the next chunk of rows exactly; returns how many (0 when every row is exact). `abort` is
        asked inside the decode: once it says stop, Preempted, and the chunk is done again next time."""
        engine, rows = self.engine, self.engine.slot.record
        start, n = rows.n_clean, len(rows)
        if start >= n:
            return 0
        why = self.refusal()
        if why:
            raise RefineRefused(why)
        rt = runtime(engine)
        limit = min(engine.ubatch_rows, engine.n_ctx - n, n - start)
        kept = rows.streams_kept(start, start + limit)
        # a chunk skips the lower layers only if every row in it can
        end = start + next((i for i, k in enumerate(kept) if k != kept[0]), limit)
        streams = SplitStreams(rt.layout, rows.stream_split, rows) if kept[0] and rt.layout else None
        t0 = time.perf_counter()
        stream = streams.rows(list(range(start, end))) if streams is not None else None
        context = self._context_for(start, end, abort) if stream is not None else None
        # their history was clean: exact and clean now, and the clean prefix moves on
        if context is not None:
            context.refine(start, end, rows.stream_split, stream, rt.layout, abort=abort)
        else:
            redecode_exact(engine, engine.slot.tokens, [Run(start, end)],
                           cells=CellTap(rt.layout) if rt.layout else None, streams=streams, abort=abort, clean=True)
        self.step_s.append(time.perf_counter() - t0)
        if self.done:
            self.close()
        return end - start

    def _context_for(self, start: int, end: int, abort=None) -> RefineContext | None:
        """Refinement's own context holding the clean prefix [0, start), where rows [start, end) have a
        known cell to copy into; None where sequence 0's cache must do (see refine_context)."""
        if min(self.engine.slot.record.cells(list(range(start, end)))) < 0:
            return None
        if self._context is not None and not self._context.serves(self.engine, end):
            self.close()
        if self._context is None:
            self._context = RefineContext(self.engine)
        split = self.engine.slot.record.stream_split
        return self._context if self._context.hold_prefix(start, split, abort) else None

    def close(self) -> None:
        """Frees refinement's own context (its cache); the next bulk chunk makes a new one."""
        if self._context is not None:
            self._context.close()
            self._context = None

    def run(self, should_stop=None) -> int:
        """Steps until every row is exact or `should_stop()` says stop (checked between chunks only)."""
        done = 0
        while not self.done and not (should_stop is not None and should_stop()):
            done += self.step()
        return done
