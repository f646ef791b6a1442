"""Sequence 0: the conversation's K/V in the engine's cache and the row record of them, one owner.

Like llama.cpp server's `server_slot`, which owns its tokens and cache, the Slot is the one way anything
writes sequence 0: rows decoded (exact, or the layers below RidgeFill's split), late K/V written from
predicted streams, rows re-decoded on a spare sequence and handed over, rows refined in a sibling context
and copied in, a saved state loaded, the cache truncated. Each method changes the K/V and the record
(backend/row_record.py) together, so no caller can do one without the other. Everyone reads the record
as `slot.record`. tests/test_state_writers.py checks that nothing else writes either.

A slot belongs to one llama.cpp context: the engine makes a new one with each context (a grown context
starts empty). The prompt cache's state mark hangs off it; RidgeFill's runtime (graph layout, weights,
maps: backend/ridgefill/runtime.py) off the engine, since it outlives a grown context.
"""
from __future__ import annotations

import copy
import time
from typing import Callable, Iterable, Protocol

import numpy as np

from .errors import Cancelled, EngineError
from .protocol import ProgressEvent
from .row_record import RowRecord

EventSink = Callable[[object], None]
CancelCheck = Callable[[], bool]


class Seq0Context(Protocol):
    """What the slot needs of its llama.cpp context (backend/engine.Engine, which makes the slot)."""

    def decode_seq0(self, tokens: list[int], start: int, *, logits_last: bool, logits_all: bool = False) -> None: ...
    def pin(self, p0: int, p1: int) -> None: ...
    def seq0_truncate(self, n_keep: int) -> int: ...
    def seq_remove_seq0(self, p0: int, p1: int) -> None: ...
    def seq_copy_to_seq0(self, src: int, p0: int, p1: int) -> None: ...
    def seq_remove(self, seq: int, p0: int, p1: int) -> None: ...
    def seq0_state(self) -> bytearray: ...
    def seq0_set_state(self, state: bytearray) -> tuple[int, int]: ...
    def context_state(self) -> bytearray: ...
    def set_context_state(self, state: bytearray) -> int: ...
    def hooked(self, hook): ...  # a context manager: the eval callback forwards to `hook` inside it


class CellRecorder(Protocol):
    """An eval hook that saw where a decode's rows went (backend/ridgefill/cache_layout.CellTap)."""

    def first_layer_cells(self) -> np.ndarray | None: ...


class CacheRows(Protocol):
    """One layer's K or V cache tensor seen as rows, one per cell (cache_layout.CacheTensor)."""

    def rows(self) -> np.ndarray: ...


# (cache tensor, cells, values): one block of K or V rows to write into sequence 0's cells
RowWrite = tuple[CacheRows, np.ndarray, np.ndarray]


class Slot:
    def __init__(self, engine: Seq0Context):
        self._engine = engine
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
               approx_tag: str | None = None, hook=None) -> None:
        """One llama_decode of up to n_batch tokens right after what is cached, recorded: exact rows, or
        rows approximated under `approx_tag`. `hook`: the eval hook for it; one that records cells
        (a CellRecorder) gives the record each row's cell."""
        if start != len(self._rows):
            raise ValueError(f"sequence 0 holds {len(self._rows)} rows; cannot decode at {start}")
        n, engine = len(tokens), self._engine
        if hook is None:
            engine.decode_seq0(tokens, start, logits_last=logits_last, logits_all=logits_all)
        else:
            with engine.hooked(hook):
                engine.decode_seq0(tokens, start, logits_last=logits_last, logits_all=logits_all)
        self._rows.append(tokens, approx_tag)
        cells = getattr(hook, "first_layer_cells", None)
        if cells is not None:
            self._rows.record_cells(start, cells())
        engine.pin(start, start + n)

    def prefill(self, tokens: list[int], *, reuse_prefix: bool = True, on_event: EventSink | None = None,
                cancel: CancelCheck | None = None, hook=None) -> tuple[int, float]:
        """Exact chunked prefill. Returns (cache_n, prompt_ms). Leaves the last token's logits ready.
        Raises Cancelled between chunks; the chunks already done stay cached for the next request.
        `hook`: a CellRecorder that gives the record each decoded row's cell (see prefill_chunks)."""
        cache_n = self.reusable_prefix(tokens) if reuse_prefix else 0
        self.truncate(cache_n)
        t0 = time.perf_counter()
        # a hook sees one graph at a time: chunks of one ubatch, so it records every row's cell
        chunk_n = self._engine.config.n_batch if hook is None else self._engine.ubatch_rows
        self.prefill_chunks(tokens, cache_n, chunk_n=chunk_n, t0=t0, on_event=on_event, cancel=cancel, hook=hook)
        return cache_n, (time.perf_counter() - t0) * 1000

    def prefill_chunks(self, tokens: list[int], pos: int, *, chunk_n: int, t0: float,
                       on_event: EventSink | None = None, cancel: CancelCheck | None = None,
                       stage: str = "prefill", hook=None) -> None:
        """Decode tokens[pos:] exactly, chunk by chunk; the last token's logits are left ready. Progress
        after each chunk (elapsed since t0); Cancelled between chunks. `hook`: the eval hook of each
        chunk's decode, reset before each (a CellRecorder records the chunk's cells: chunk_n at most one
        ubatch)."""
        while pos < len(tokens):
            if cancel is not None and cancel():
                raise Cancelled(f"prefill cancelled after {pos} of {len(tokens)} tokens")
            chunk = tokens[pos : pos + chunk_n]
            if hook is not None and hasattr(hook, "reset"):
                hook.reset()
            self.decode(chunk, pos, logits_last=pos + len(chunk) == len(tokens), hook=hook)
            pos += len(chunk)
            if on_event is not None:
                on_event(ProgressEvent(pos, len(tokens), (time.perf_counter() - t0) * 1000, stage=stage))

    # ---- RidgeFill's writes ----------------------------------------------------------------------
    def write_late(self, writes: Iterable[RowWrite], *, split: int | None = None, start: int = 0,
                   streams: np.ndarray | None = None) -> None:
        """Late layers' K/V of approximated rows, written into their cells; with `streams`, rows start..
        keep their streams entering `split` (a bulk pass computed them) in the record."""
        for tensor, cells, values in writes:
            tensor.rows()[cells] = values
        if streams is not None:
            self._rows.keep_split_streams(split, start, streams)

    def take_rows(self, seq: int, start: int, end: int, cells=None, *, clean: bool = False) -> None:
        """Rows [start, end), decoded again through every layer on spare sequence `seq`, replace sequence 0's
        approximate ones (whose cells are freed); `cells`: where they are, where known. `clean`: they were
        decoded with every row before them clean (refinement, in prompt order)."""
        engine = self._engine
        engine.seq_remove_seq0(start, end)
        engine.seq_copy_to_seq0(seq, start, end)
        engine.seq_remove(seq, -1, -1)
        self._rows.mark_exact(start, end, cells)
        if clean:
            self._rows.mark_clean(start, end)

    def copy_exact_rows(self, start: int, end: int, cells: np.ndarray,
                        layer_rows: Iterable[tuple[CacheRows, np.ndarray]]) -> None:
        """Rows [start, end) in `cells`, refined in a sibling context with a clean history: their K or V rows
        of each layer written there, copied into those cells (the layers below are exact already); exact
        and clean now."""
        for tensor, values in layer_rows:
            tensor.rows()[cells] = values
        self._rows.mark_exact(start, end, cells)
        self._rows.mark_clean(start, end)

    # ---- truncation and llama.cpp's saved state --------------------------------------------------
    def truncate(self, n_keep: int) -> None:
        """Drop cached K/V from position n_keep on (0: all)."""
        kept = self._engine.seq0_truncate(n_keep)
        self._rows.truncate(kept)

    def state_bytes(self) -> bytearray:
        """Sequence 0's cells as llama.cpp saves them (see backend/seq_state.py)."""
        return self._engine.seq0_state()

    def snapshot(self) -> tuple[bytearray, RowRecord]:
        """The whole context's cells and a copy of the record: `restore_snapshot` puts every row back in
        its own cell (a sliding-window model's windows too), where a saved sequence 0 would not."""
        return self._engine.context_state(), copy.deepcopy(self._rows)

    def restore_snapshot(self, state: bytearray, rows: RowRecord) -> None:
        """Sequence 0 as `snapshot` saved it, in this context (EngineError, the cache empty, if not)."""
        self.truncate(0)
        held = self._engine.set_context_state(state)
        if held != len(rows):
            self.truncate(0)
            raise EngineError(f"the saved context holds {held:,} rows for a record of {len(rows):,}")
        self._rows = copy.deepcopy(rows)

    def load_state(self, state: bytearray, rows: RowRecord) -> None:
        """Sequence 0 becomes `state` (state_bytes of this model, maybe in another process) and `rows` its
        record. EngineError, with the cache left empty, when llama.cpp refuses it or it holds another
        number of rows than the record."""
        self.truncate(0)
        read, held = self._engine.seq0_set_state(state)
        if read != len(state) or held != len(rows):
            self.truncate(0)
            raise EngineError(f"llama.cpp took {read:,} of the state's {len(state):,} bytes, holding {held:,} "
                              f"rows for a record of {len(rows):,}")
        self._rows = rows
