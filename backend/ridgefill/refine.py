"""Refinement in idle time: sequence 0's approximated rows made exact in prompt order, a chunk at a time.

A row decoded after an approximated one saw approximated history, so the cache equals exact's only once
every row from the first unclean one to the end is decoded again, in order: the tail, the answer and
rows guided made exact included. Each chunk is one run through redecode.redecode_exact, on a spare
sequence that shares the rows before it (already exact); a chunk of rows whose stream entering the
split a bulk pass kept runs only the layers from the split on (lower_skip), other rows (the exact tail,
the answer) run through every layer. The chunk is sized so that one takes about TARGET_S: the caller
looks for new work between chunks, so a new task waits for one chunk at most.

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
from .runtime import runtime

TARGET_S = 0.4  # per chunk: a new request waits at most about this long (the issue asks for under 0.5 s)
# Fewer rows than this take llama.cpp's per-row attention kernel, about twice as slow per row as the
# tiled one (docs/MEASUREMENTS.md#one-call-re-decode; docs/MEASUREMENTS.md#refinement-chunks).
MIN_CHUNK = 64
FIRST_CHUNK = 64  # until the first chunk's time says how many rows fit TARGET_S


class RefineRefused(RidgeFillError):
    """Rows that cannot be made exact here (a sliding-window model, a full context)."""


class Refinement:
    """Makes `engine`'s sequence 0 exact, one `step()` at a time."""

    def __init__(self, engine):
        self.engine = engine
        # rows per chunk, learned apart for chunks that skip the lower layers and chunks that run them all
        # (a size learned on one kind made the other's chunk take ten times TARGET_S)
        self.chunk = {True: FIRST_CHUNK, False: FIRST_CHUNK}
        self.step_s: list[float] = []  # each chunk's time (the bench reports the longest)

    @property
    def done(self) -> bool:
        return self.engine.row_record.all_exact

    def refusal(self) -> str | None:
        """Why the rows cannot be made exact on this engine, or None."""
        rt = runtime(self.engine)
        if rt.swa_layers and not rt.windows_kept:
            return ("refinement needs every row's sliding window kept (a full-size sliding-window cache): rows "
                    "decoded again would lose their window")
        free = self.engine.n_ctx - len(self.engine.row_record)
        if not self.done and free < MIN_CHUNK:
            return f"the context has {free} free cells: too few to decode rows again beside the old ones"
        return None

    def step(self) -> int:
        """Decode the next chunk of rows exactly; returns how many (0 when every row is exact)."""
        engine, rows = self.engine, self.engine.row_record
        start, n = rows.n_clean, len(rows)
        if start >= n:
            return 0
        why = self.refusal()
        if why:
            raise RefineRefused(why)
        rt = runtime(engine)
        skip = bool(rows.streams_kept(start, start + 1)[0])
        limit = min(self.chunk[skip], engine.ubatch_rows, engine.n_ctx - n, n - start)
        kept = rows.streams_kept(start, start + limit)
        # a chunk skips the lower layers only if every row in it can
        end = start + next((i for i, k in enumerate(kept) if k != kept[0]), limit)
        streams = SplitStreams(rt.layout, rows.stream_split, rows) if kept[0] and rt.layout else None
        t0 = time.perf_counter()
        redecode_exact(engine, engine.kv_tokens, [Run(start, end)],
                       cells=CellTap(rt.layout) if rt.layout else None, streams=streams)
        engine.mark_clean(start, end)  # their history was clean: the clean prefix moves on
        dt = time.perf_counter() - t0
        self.step_s.append(dt)
        if end - start >= self.chunk[skip] or dt > TARGET_S:  # a full chunk's time says what fits
            self.chunk[skip] = max(MIN_CHUNK, min(engine.ubatch_rows, int((end - start) * TARGET_S / max(dt, 1e-6))))
        return end - start

    def run(self, should_stop=None) -> int:
        """Steps until every row is exact or `should_stop()` says stop (checked between chunks)."""
        done = 0
        while not self.done and not (should_stop is not None and should_stop()):
            done += self.step()
        return done
