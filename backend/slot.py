"""Sequence 0: the conversation's K/V in the engine's cache and the row record of them, one owner.

Like llama.cpp server's `server_slot`, which owns its tokens and cache, the Slot is the one way anything
writes sequence 0: rows decoded (exact, or the layers below RidgeFill's split), late K/V written from
predicted streams, rows re-decoded on a spare sequence and handed over, rows refined in a sibling context
and copied in, a saved state loaded, the cache truncated. Each method changes the K/V and the record
(backend/row_record.py) together, so no caller can do one without the other. Everyone reads the record
as `slot.record`. tests/test_state_writers.py checks that nothing else writes either.

A slot holds its llama.cpp context (backend/llama_context.py) and calls llama.cpp itself, as
`server_slot` holds its context handle: the engine makes a context and its slot together, a new pair
when the context grows (a grown context starts empty), and never sits between them. The refinement's
own context (backend/ridgefill/refine_context.py) has a slot of this class, with its own record. The
prompt cache's state mark hangs off the slot; RidgeFill's runtime (graph layout, weights, maps:
backend/ridgefill/runtime.py) off the engine, since it outlives a grown context.
"""
from __future__ import annotations

import copy
import ctypes
import time
from contextlib import nullcontext
from typing import Callable, Iterable, Protocol

import llama_cpp
import numpy as np

from .errors import Cancelled, EngineError
from .llama_context import LlamaContext
from .protocol import ProgressEvent
from .row_record import RowRecord

EventSink = Callable[[object], None]
CancelCheck = Callable[[], bool]


class CellRecorder(Protocol):
    """An eval hook that saw where a decode's rows went (backend/ridgefill/cache_layout.CellTap)."""

    def first_layer_cells(self) -> np.ndarray | None: ...


class CacheRows(Protocol):
    """One layer's K or V cache tensor seen as rows, one per cell (cache_layout.CacheTensor)."""

    def rows(self) -> np.ndarray: ...


# (cache tensor, cells, values): one block of K or V rows to write into sequence 0's cells
RowWrite = tuple[CacheRows, np.ndarray, np.ndarray]


class Slot:
    def __init__(self, context: LlamaContext, pin_seq: int | None = None):
        """Sequence 0 of `context`, which it holds (as `server_slot` holds its context); `pin_seq`: the
        sequence that holds every cell sequence 0 holds (Engine.pin_seq), or None."""
        self.context = context
        self.pin_seq = pin_seq
        self._rows = RowRecord()
        self.state_mark: str | None = None  # hex of this build's state header (backend/prompt_reuse.py)

    # ---- reading ---------------------------------------------------------------------------------
    @property
    def record(self) -> RowRecord:
        """What each row of sequence 0 holds: read it here; only the methods below change it."""
        return self._rows

    @property
    def tokens(self) -> list[int]:
        return self._rows.tokens

    def __len__(self) -> int:
        return len(self._rows)

    def holds(self, tokens: list[int]) -> bool:
        """Whether sequence 0's first rows are `tokens` (the prompt just answered is still in the cache)."""
        return len(self._rows) >= len(tokens) and self._rows.tokens[: len(tokens)] == list(tokens)

    def reusable_prefix(self, tokens: list[int], accept_tag: str | None = None) -> int:
        """Leading `tokens` already cached that a request may reuse (see row_record.RowRecord)."""
        return self._rows.reusable_prefix(tokens, accept_tag)

    # ---- decoding onto sequence 0 ----------------------------------------------------------------
    def decode(self, tokens: list[int], start: int, *, logits_last: bool = False, logits_all: bool = False,
               approx_tag: str | None = None, hook=None, abort: CancelCheck | None = None) -> None:
        """One llama_decode of up to n_batch tokens right after what is cached, recorded: exact rows, or
        rows approximated under `approx_tag`. `hook`: the eval hook for it; one that records cells
        (a CellRecorder) gives the record each row's cell. `abort`: asked inside the decode (one graph
        at most): Preempted, and nothing of it stays."""
        if start != len(self._rows):
            raise ValueError(f"sequence 0 holds {len(self._rows)} rows; cannot decode at {start}")
        ctx, n = self.context, len(tokens)
        batch = ctx.batch(tokens, range(start, start + n), [0] * n, logits_last=logits_last, logits_all=logits_all,
                          abort=abort)
        with ctx.hooked(hook) if hook is not None else nullcontext(), ctx.abortable(abort):
            rc = llama_cpp.llama_decode(ctx.handle, batch)
        self._decoded(rc, tokens, start, approx_tag, hook, abort)

    def prefill(self, tokens: list[int], start: int | None = None, *, reuse_prefix: bool = True,
                on_event: EventSink | None = None, cancel: CancelCheck | None = None, hook=None,
                chunk_n: int | None = None, t0: float | None = None, stage: str = "prefill") -> tuple[int, float]:
        """Exact chunked prefill of tokens[start:] (start None: after the prefix reused, or 0 without
        `reuse_prefix`; what follows it is dropped). Returns (cache_n, prompt_ms). Leaves the last token's
        logits ready. Progress after each chunk (elapsed since t0); Cancelled between chunks, the chunks
        already done staying cached for the next request. `hook`: the eval hook of each chunk's decode,
        reset before each; a CellRecorder gives the record each decoded row's cell (chunks of one ubatch:
        a hook sees one graph at a time)."""
        ctx = self.context
        if start is None:
            start = self.reusable_prefix(tokens) if reuse_prefix else 0
            self.truncate(start)
        t0 = time.perf_counter() if t0 is None else t0
        chunk_n = chunk_n or (ctx.n_batch if hook is None else ctx.ubatch_rows)
        pos = start
        while pos < len(tokens):
            if cancel is not None and cancel():
                raise Cancelled(f"prefill cancelled after {pos} of {len(tokens)} tokens")
            chunk = tokens[pos : pos + chunk_n]
            if hook is not None and hasattr(hook, "reset"):
                hook.reset()
            n, last = len(chunk), pos + len(chunk) == len(tokens)
            batch = ctx.batch(chunk, range(pos, pos + n), [0] * n, logits_last=last)
            with ctx.hooked(hook) if hook is not None else nullcontext():
                rc = llama_cpp.llama_decode(ctx.handle, batch)
            self._decoded(rc, chunk, pos, None, hook)
            pos += n
            if on_event is not None:
                on_event(ProgressEvent(pos, len(tokens), (time.perf_counter() - t0) * 1000, stage=stage))
        return start, (time.perf_counter() - t0) * 1000

    def _decoded(self, rc: int, tokens: list[int], start: int, approx_tag: str | None, hook,
                 abort: CancelCheck | None = None) -> None:
        """After a llama_decode of `tokens` at `start` on sequence 0: its outcome checked, its rows
        recorded (their cells, where `hook` recorded them) and pinned."""
        n = len(tokens)
        self.context.check(rc, n, start, abort)
        self._rows.append(tokens, approx_tag)
        cells = getattr(hook, "first_layer_cells", None)
        if cells is not None:
            self._rows.record_cells(start, cells())
        self._pin(start, start + n)

    def _pin(self, p0: int, p1: int) -> None:
        """The pin sequence (Engine.pin_seq) takes sequence 0's cells at positions [p0, p1)."""
        if self.pin_seq is not None:
            llama_cpp.llama_memory_seq_cp(self.context.mem, 0, self.pin_seq, p0, p1)

    # ---- RidgeFill's writes ----------------------------------------------------------------------
    def write_late(self, writes: Iterable[RowWrite], *, split: int | None = None, start: int = 0,
                   streams: np.ndarray | None = None) -> None:
        """K/V rows written into their cells: the one writer of K/V outside llama.cpp's decodes. Late
        layers' K/V of approximated rows (the bulk pass, the sliding windows), a re-decoded row's lower
        layers copied from its old cell (lower_skip), a refined row's upper layers (refine_context). With
        `streams`, rows start.. keep their streams entering `split` (a bulk pass computed them) in the
        record."""
        for tensor, cells, values in writes:
            tensor.rows()[cells] = values
        if streams is not None:
            self._rows.keep_split_streams(split, start, streams)

    def take_rows(self, seq: int, start: int, end: int, cells=None, *, clean: bool = False) -> None:
        """Rows [start, end), decoded again through every layer on spare sequence `seq`, replace sequence 0's
        approximate ones (whose cells are freed); `cells`: where they are, where known. `clean`: they were
        decoded with every row before them clean (refinement, in prompt order)."""
        mem = self.context.mem
        if not llama_cpp.llama_memory_seq_rm(mem, 0, start, end):
            raise EngineError(f"llama.cpp could not remove positions {start}..{end} of sequence 0")
        if self.pin_seq is not None:
            llama_cpp.llama_memory_seq_rm(mem, self.pin_seq, start, end)
        llama_cpp.llama_memory_seq_cp(mem, seq, 0, start, end)
        self._pin(start, end)
        self.context.seq_remove(seq, -1, -1)
        self._rows.mark_exact(start, end, cells)
        if clean:
            self._rows.mark_clean(start, end)

    def copy_exact_rows(self, start: int, end: int, cells: np.ndarray,
                        layer_rows: Iterable[tuple[CacheRows, np.ndarray]]) -> None:
        """Rows [start, end) in `cells`, refined in a sibling context with a clean history: their K or V rows
        of each layer written there, copied into those cells (the layers below are exact already); exact
        and clean now."""
        self.write_late((tensor, cells, values) for tensor, values in layer_rows)
        self._rows.mark_exact(start, end, cells)
        self._rows.mark_clean(start, end)

    # ---- truncation and llama.cpp's saved state --------------------------------------------------
    def truncate(self, n_keep: int) -> None:
        """Drop cached K/V from position n_keep on (0: every sequence's)."""
        mem = self.context.mem
        if n_keep > 0 and not llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, -1):
            n_keep = 0
        if n_keep > 0 and self.pin_seq is not None:
            llama_cpp.llama_memory_seq_rm(mem, self.pin_seq, n_keep, -1)
        if n_keep <= 0:
            llama_cpp.llama_memory_clear(mem, True)
        self._rows.truncate(max(0, n_keep))

    def state_bytes(self) -> bytearray:
        """Sequence 0's cells as llama.cpp saves them (llama_state_seq_get_data; see backend/seq_state.py)."""
        handle = self.context.handle
        n = llama_cpp.llama_state_seq_get_size(handle, 0)
        buf = bytearray(n)
        if llama_cpp.llama_state_seq_get_data(handle, (ctypes.c_uint8 * n).from_buffer(buf), n, 0) != n:
            raise EngineError("llama.cpp could not copy sequence 0's state")
        return buf

    def snapshot(self) -> tuple[bytearray, RowRecord]:
        """The whole context's cells (llama_state_get_data) and a copy of the record: loaded into a
        context whose cache was empty when they were written, `restore_snapshot` puts every row back in
        its own cell (a sliding-window model's windows too), where a saved sequence 0 would not."""
        handle = self.context.handle
        n = llama_cpp.llama_state_get_size(handle)
        buf = bytearray(n)
        got = llama_cpp.llama_state_get_data(handle, (ctypes.c_uint8 * n).from_buffer(buf), n)
        return buf[:got], copy.deepcopy(self._rows)

    def restore_snapshot(self, state: bytearray, rows: RowRecord) -> None:
        """Sequence 0 as `snapshot` saved it, in this context (EngineError, the cache empty, if not)."""
        self.truncate(0)
        n = len(state)
        if llama_cpp.llama_state_set_data(self.context.handle, (ctypes.c_uint8 * n).from_buffer(state), n) != n:
            raise EngineError("llama.cpp could not load the context's saved state")
        held = llama_cpp.llama_memory_seq_pos_max(self.context.mem, 0) + 1
        if held != len(rows):
            self.truncate(0)
            raise EngineError(f"the saved context holds {held:,} rows for a record of {len(rows):,}")
        self._rows = copy.deepcopy(rows)

    def load_state(self, state: bytearray, rows: RowRecord) -> None:
        """Sequence 0 becomes `state` (state_bytes of this model, maybe in another process) and `rows` its
        record. EngineError, with the cache left empty, when llama.cpp refuses it or it holds another
        number of rows than the record."""
        self.truncate(0)
        n = len(state)
        read = llama_cpp.llama_state_seq_set_data(self.context.handle, (ctypes.c_uint8 * n).from_buffer(state), n, 0)
        held = llama_cpp.llama_memory_seq_pos_max(self.context.mem, 0) + 1
        self._pin(0, held)
        if read != len(state) or held != len(rows):
            self.truncate(0)
            raise EngineError(f"llama.cpp took {read:,} of the state's {len(state):,} bytes, holding {held:,} "
                              f"rows for a record of {len(rows):,}")
        self._rows = rows
