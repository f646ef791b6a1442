"""The engine: a wrapper of one llama.cpp context on a loaded model (tokens, decode, sequences, state).

One Engine owns one context and must be used from one thread (a llama context is not thread-safe). Its
sequence 0, the conversation, is written only through its slot (backend/slot.py); a request goes
through backend/completion.py.
The context is built with an eval callback (`cb_eval`) installed from the start; it asks for no node
until RidgeFill sets `eval_hook`, so exact runs pay nothing for it.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Protocol

import llama_cpp
import numpy as np

from .errors import DocumentTooLongError, EngineError, ModelFileError, Preempted
from .context_size import CTX_STEP, answer_reserve, check_fits, context_cap, grown_size
from .model_file import ModelInfo, read_model_info
from .protocol import AUTO_CTX, DEFAULT_N_CTX, N_BATCH
from .sampler import SamplerChain
from .slot import Slot
from .vocabulary import Vocabulary

log = logging.getLogger(__name__)

GGML_TYPE_F16 = 1
# K/V cache types a context may be made with: f16 (RidgeFill writes it), or llama.cpp's q8_0, the lossy
# cache people run every day and the yardstick of `fidelity` (lab/evals/fidelity.py)
KV_TYPES = {"f16": GGML_TYPE_F16, "q8_0": 8}
EventSink = Callable[[object], None]
CancelCheck = Callable[[], bool]


class EvalHook(Protocol):
    """What the eval callback forwards to. Must not raise (see `_on_eval`)."""

    def wants(self, tensor: int) -> bool: ...  # ask=true: compute this node and show it to me?

    def seen(self, tensor: int) -> bool: ...  # ask=false: node computed; False stops the graph


@dataclass
class EngineConfig:
    model_path: str
    n_ctx: int = DEFAULT_N_CTX  # capped at the model's training context
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    n_batch: int = N_BATCH
    n_ubatch: int = N_BATCH
    # Sliding-window layers keep every row (llama.cpp's full-size SWA cache), so a row decoded again deep
    # in the prompt finds its window's history (guided, quality on gemma3); costs a cache of n_ctx rows
    # per sliding-window layer (docs/measurements/gemma-3.md#guided-on-sliding-window-models).
    swa_full: bool = True
    kv_type: str = "f16"  # a key of KV_TYPES; RidgeFill refuses any other than f16 (cache_layout.py)


# Sequence 0 is the conversation; 1..N_SEQ-1 serve rows decoded again (one per run, so a whole set of
# runs goes through llama.cpp in one batch: its small-batch path is slower per row,
# docs/measurements/guided-design.md#exact-rows-in-one-decode) and probes.
N_SEQ = 32

ABORT_POLL_S = 0.02  # an abortable decode asks its `abort` check at most this often (per graph node otherwise)


def _install_llama_log_filter() -> None:
    """Route llama.cpp's chatter to Python logging at DEBUG instead of stderr."""
    global _LOG_CB
    if _LOG_CB is not None:
        return

    @llama_cpp.llama_log_callback
    def _cb(level, text, user_data):  # noqa: ARG001
        try:
            log.debug("llama.cpp: %s", text.decode("utf-8", "replace").rstrip())
        except Exception:
            pass

    _LOG_CB = _cb
    llama_cpp.llama_log_set(_LOG_CB, ctypes.c_void_p(0))


_LOG_CB = None
_BACKEND_READY = False


class Engine(Vocabulary):
    def __init__(self, config: EngineConfig, *, model_of: "Engine | None" = None, n_seq: int = 0):
        """An engine with its own context; `model_of`: on that engine's loaded model, `n_seq`: with
        that many sequences instead of N_SEQ (see `sibling`)."""
        global _BACKEND_READY
        self.config = config
        # read_model_info raises ModelFileError
        self.info: ModelInfo = model_of.info if model_of else read_model_info(config.model_path)
        _install_llama_log_filter()
        if not _BACKEND_READY:
            llama_cpp.llama_backend_init()
            _BACKEND_READY = True

        self._owns_model = model_of is None
        self._siblings: weakref.WeakSet[Engine] = weakref.WeakSet()  # closed before the model they use
        mparams = llama_cpp.llama_model_default_params()
        mparams.use_mmap = True
        self._model = model_of._model if model_of else \
            llama_cpp.llama_model_load_from_file(str(config.model_path).encode(), mparams)
        if not self._model:
            raise ModelFileError(
                f"llama.cpp could not load {self.info.path} ({self.info.architecture}). The file may be "
                "damaged, or its architecture is not supported by this llama.cpp build."
            )
        Vocabulary.__init__(self, self._model, self.info.chat_template)

        # The most tokens the context may hold: the asked size, or (AUTO_CTX) the model's trained context
        # and what RAM allows; an automatic context starts small and grows with the document.
        self.auto_ctx = config.n_ctx == AUTO_CTX
        trained = self.info.n_ctx_train or config.n_ctx
        self.n_ctx_max = context_cap(self.info) if self.auto_ctx else min(config.n_ctx, trained)
        self.n_seq = n_seq or N_SEQ
        # With a full-size sliding-window cache, the last sequence holds every cell sequence 0 holds:
        # llama.cpp's sliding-window cache reuses a cell outside the window only when one sequence holds
        # it, so no row's window is ever overwritten and both caches give every row the same cell.
        self.pin_seq: int | None = (self.n_seq - 1 if config.swa_full and self.info.has_sliding_window
                                    and self.n_seq > 1 else None)
        self.eval_hook: EvalHook | None = None
        self._eval_cb = llama_cpp.ggml_backend_sched_eval_callback(self._on_eval)  # keep a reference
        self._abort_cb = llama_cpp.ggml_abort_callback(self._on_abort_poll)  # keep a reference
        self._abort_check: CancelCheck | None = None  # set only inside an abortable decode_rows
        self._abort_asked_at = 0.0
        self.context_generation = 0  # counts the contexts made: RidgeFill's layout belongs to one
        self._ctx = None
        self._make_context(min(CTX_STEP, self.n_ctx_max) if self.auto_ctx else self.n_ctx_max)
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        # RidgeFill's state for this engine (it outlives a grown context): read it typed through
        # backend/ridgefill/runtime.runtime(), which makes it and is its only writer. Not imported here:
        # ridgefill's map fitting makes engines, and backend has no import cycles.
        self.ridgefill: object | None = None

    def _make_context(self, n_ctx: int, grow: bool = False) -> None:
        """A new llama.cpp context of `n_ctx` tokens in place of the old one (its cache is gone). When it
        fails, the model is freed too (the engine is dead), unless it was to `grow` a working engine."""
        config = self.config
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = min(config.n_ubatch, config.n_batch)
        # Several sequences on one unified cache: RidgeFill's quality mode decodes selected bulk rows
        # again on sequences that share sequence 0's cells, then hands the new cells to sequence 0.
        cparams.n_seq_max = self.n_seq
        cparams.kv_unified = True
        cparams.swa_full = config.swa_full
        cparams.n_threads = config.n_threads
        cparams.n_threads_batch = config.n_threads
        # Flash attention keeps V rows laid out like K (not transposed); F16 KV, no Hadamard rotation.
        cparams.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.type_k = cparams.type_v = KV_TYPES[config.kv_type]
        cparams.no_perf = True
        cparams.cb_eval = self._eval_cb
        cparams.cb_eval_user_data = None
        self._ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            if not grow:
                if self._owns_model:
                    llama_cpp.llama_model_free(self._model)
                self._model = None
            raise EngineError(f"llama.cpp could not create a context of {n_ctx} tokens (out of memory?).")
        self.n_ctx = llama_cpp.llama_n_ctx(self._ctx)
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        # Sequence 0 and the record of its rows: a new context starts with an empty one.
        self.slot = Slot(self)
        self.context_generation += 1

    # ---- eval callback -------------------------------------------------------------------------
    @contextmanager
    def hooked(self, hook: EvalHook) -> Iterator[EvalHook]:
        """Forward the eval callback to `hook` inside the block; the previous hook comes back after,
        whatever happens."""
        prev, self.eval_hook = self.eval_hook, hook
        try:
            yield hook
        finally:
            self.eval_hook = prev

    def _on_eval(self, tensor, ask, user_data):  # noqa: ARG002
        """ctypes turns an exception here into `False`, which silently cuts a normal decode, so
        everything is caught: on error, 'not wanted' when asked, 'go on' after computing."""
        hook = self.eval_hook
        if hook is None:
            return False if ask else True
        try:
            return bool(hook.wants(tensor)) if ask else bool(hook.seen(tensor))
        except Exception:  # pragma: no cover - logged, never propagated into C
            log.exception("eval hook failed")
            return False if ask else True

    def answer_reserve(self, max_tokens: int) -> int:
        """Room kept after the prompt for an answer of up to `max_tokens` (at most half the context)."""
        return answer_reserve(self.n_ctx_max, max_tokens)

    def check_fits(self, n_prompt: int, max_tokens: int) -> None:
        """DocumentTooLongError unless the prompt and its answer fit the most this context may hold."""
        check_fits(self.n_ctx_max, n_prompt, max_tokens)

    def make_room(self, n_prompt: int, max_tokens: int) -> None:
        """check_fits, then an automatic context grows (in CTX_STEP steps) to hold the prompt and its
        answer: the cached rows are lost, the prompt is prefilled anew."""
        self.check_fits(n_prompt, max_tokens)
        grown = grown_size(self.n_ctx, self.n_ctx_max, n_prompt + self.answer_reserve(max_tokens))
        if grown and self.auto_ctx:
            old = self.n_ctx
            try:
                self._make_context(grown, grow=True)
            except EngineError:  # out of memory: the engine goes on at its old size, the prompt is refused
                self._make_context(old)
                raise DocumentTooLongError(n_prompt, old, self.answer_reserve(max_tokens), no_memory=True) from None

    # ---- low level -----------------------------------------------------------------------------
    # ---- sequence 0's K/V: only backend/slot.py calls these (tests/test_state_writers.py) --------------
    def decode_seq0(self, tokens: list[int], start: int, *, logits_last: bool, logits_all: bool = False) -> None:
        """One llama_decode of rows start.. on sequence 0 (the slot records them)."""
        n = len(tokens)
        self._decode(tokens, range(start, start + n), [0] * n, logits_last=logits_last, logits_all=logits_all)

    def pin(self, p0: int, p1: int) -> None:
        """The pin sequence (see __init__) takes sequence 0's cells at positions [p0, p1)."""
        if self.pin_seq is not None:
            llama_cpp.llama_memory_seq_cp(self._mem, 0, self.pin_seq, p0, p1)

    def seq0_truncate(self, n_keep: int) -> int:
        """Drop sequence 0's K/V from position n_keep on (every sequence's, when that is 0); the rows kept."""
        if n_keep > 0 and not llama_cpp.llama_memory_seq_rm(self._mem, 0, n_keep, -1):
            n_keep = 0
        if n_keep > 0 and self.pin_seq is not None:
            llama_cpp.llama_memory_seq_rm(self._mem, self.pin_seq, n_keep, -1)
        if n_keep <= 0:
            llama_cpp.llama_memory_clear(self._mem, True)
        return max(0, n_keep)

    def seq_remove_seq0(self, p0: int, p1: int) -> None:
        """Sequence 0 (and its pin) let go of its cells at positions [p0, p1)."""
        self._seq_rm(0, p0, p1)
        if self.pin_seq is not None:
            llama_cpp.llama_memory_seq_rm(self._mem, self.pin_seq, p0, p1)

    def seq_copy_to_seq0(self, src: int, p0: int, p1: int) -> None:
        """Sequence 0 (and its pin) take sequence `src`'s cells at positions [p0, p1)."""
        llama_cpp.llama_memory_seq_cp(self._mem, src, 0, p0, p1)
        self.pin(p0, p1)

    def seq0_state(self) -> bytearray:
        """Sequence 0's cells as llama.cpp saves them (llama_state_seq_get_data; see backend/seq_state.py)."""
        n = llama_cpp.llama_state_seq_get_size(self._ctx, 0)
        buf = bytearray(n)
        if llama_cpp.llama_state_seq_get_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(buf), n, 0) != n:
            raise EngineError("llama.cpp could not copy sequence 0's state")
        return buf

    def context_state(self) -> bytearray:
        """Every sequence's cells as llama.cpp saves a whole context (llama_state_get_data): loaded into a
        context whose cache was empty when they were written, every row gets its cell back."""
        n = llama_cpp.llama_state_get_size(self._ctx)
        buf = bytearray(n)
        got = llama_cpp.llama_state_get_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(buf), n)
        return buf[:got]

    def set_context_state(self, state: bytearray) -> int:
        """llama.cpp reads a whole `state` (context_state of this context): sequence 0's rows it holds."""
        n = len(state)
        if llama_cpp.llama_state_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(state), n) != n:
            raise EngineError("llama.cpp could not load the context's saved state")
        return llama_cpp.llama_memory_seq_pos_max(self._mem, 0) + 1

    def seq0_set_state(self, state: bytearray) -> tuple[int, int]:
        """llama.cpp reads `state` into the empty sequence 0: (bytes it took, rows it holds)."""
        n = len(state)
        read = llama_cpp.llama_state_seq_set_data(self._ctx, (ctypes.c_uint8 * n).from_buffer(state), n, 0)
        held = llama_cpp.llama_memory_seq_pos_max(self._mem, 0) + 1
        self.pin(0, held)
        return read, held

    # ---- other sequences -----------------------------------------------------------------------
    @property
    def ubatch_rows(self) -> int:
        """The most rows llama.cpp computes in one graph: what an eval hook sees at once (a decode of more
        rows runs as several graphs, and a hook that reads one graph's cells would miss the others')."""
        return min(self.config.n_batch, self.config.n_ubatch)

    def decode_rows(self, tokens: list[int], positions, seqs: list[int], *, logits_last: bool = False,
                    logits_all: bool = False, abort: CancelCheck | None = None) -> None:
        """Rows onto the spare sequences (never sequence 0: that is the slot's), as `_decode`."""
        if 0 in seqs and self.n_seq > 1:
            raise ValueError("sequence 0 is written through the engine's slot (backend/slot.py)")
        self._decode(tokens, positions, seqs, logits_last=logits_last, logits_all=logits_all, abort=abort)

    def _decode(self, tokens: list[int], positions, seqs: list[int], *, logits_last: bool = False,
                logits_all: bool = False, abort: CancelCheck | None = None) -> None:
        """One llama_decode of rows with their own positions and sequences; logits for every row
        (logits_all) or the last one (logits_last), else none. With `abort`, llama.cpp asks it between
        graph nodes and stops once it says so: Preempted, and llama.cpp takes the batch's rows off
        their sequences again (a batch of at most ubatch_rows is one graph, so nothing of it stays)."""
        n = len(tokens)
        if n == 0 or n > self.config.n_batch:
            raise ValueError(f"decode takes 1..{self.config.n_batch} tokens, got {n}")
        b = self._batch
        b.n_tokens = n
        for i, (tok, pos, seq) in enumerate(zip(tokens, positions, seqs)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits_all
            b.seq_id[i][0] = seq
        b.logits[n - 1] = logits_last or logits_all
        if abort is not None and n > self.ubatch_rows:
            raise ValueError(f"an abortable decode takes at most {self.ubatch_rows} rows (one graph), got {n}")
        with self._abortable(abort):
            rc = llama_cpp.llama_decode(self._ctx, b)
        if rc == 2 and abort is not None:
            raise Preempted(f"decode of {n} rows from position {positions[0]} stopped for new work")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on {n} rows from position {positions[0]}")

    @contextmanager
    def _abortable(self, abort: CancelCheck | None) -> Iterator[None]:
        """llama.cpp's abort callback asks `abort` inside the block (none is set outside it)."""
        if abort is None:
            yield
            return
        self._abort_check, self._abort_asked_at = abort, 0.0
        llama_cpp.llama_set_abort_callback(self._ctx, self._abort_cb, None)
        try:
            yield
        finally:
            llama_cpp.llama_set_abort_callback(self._ctx, llama_cpp.ggml_abort_callback(), None)
            self._abort_check = None

    def _on_abort_poll(self, data) -> bool:  # noqa: ARG002
        """Asked by llama.cpp before each graph node: True stops the decode. Never raises into C."""
        check, now = self._abort_check, time.monotonic()
        if check is None or now - self._abort_asked_at < ABORT_POLL_S:
            return False
        self._abort_asked_at = now
        try:
            return bool(check())
        except Exception:  # pragma: no cover - logged, never propagated into C
            log.exception("abort check failed")
            return False

    def row_logits(self, n_rows: int) -> np.ndarray:
        """Logits of the last decode's rows (decoded with logits_all), shape (n_rows, n_vocab)."""
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, 0)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab)).copy()

    def last_logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self._ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    @contextmanager
    def scratch(self) -> Iterator["Engine"]:
        """A block that uses the context for its own rows (a capture, an eval item, a discovery decode):
        every sequence is cleared after it, whatever happens, so no later request reuses its rows."""
        try:
            yield self
        finally:
            self.slot.truncate(0)

    def seq_copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let spare sequence `dst` share `src`'s cells at positions [p0, p1) (no data moves: one cache)."""
        if dst == 0:
            raise ValueError("sequence 0 takes cells through the engine's slot (backend/slot.py)")
        llama_cpp.llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_remove(self, seq: int, p0: int, p1: int) -> None:
        """Take spare sequence `seq` off its cells at positions [p0, p1) (-1, -1: all); a cell no sequence
        holds is free."""
        if seq == 0 and self.n_seq > 1:
            raise ValueError("sequence 0 lets go of cells through the engine's slot (backend/slot.py)")
        self._seq_rm(seq, p0, p1)

    def _seq_rm(self, seq: int, p0: int, p1: int) -> None:
        if not llama_cpp.llama_memory_seq_rm(self._mem, seq, p0, p1):
            raise EngineError(f"llama.cpp could not remove positions {p0}..{p1} of sequence {seq}")

    @property
    def spare_sequences(self) -> range:
        """The sequences that serve rows decoded again and probes (1.., less the pin)."""
        return range(1, self.n_seq if self.pin_seq is None else self.pin_seq)

    def clear_spare_sequences(self) -> None:
        """The spare sequences let go of every cell."""
        for s in self.spare_sequences:
            self.seq_remove(s, -1, -1)

    @property
    def llama_cpp_version(self) -> str:
        """The llama-cpp-python build whose state format the slot's state_bytes writes."""
        return llama_cpp.__version__

    def sample(self, sampler: SamplerChain) -> int:
        """A token drawn by `sampler` (llama.cpp's chain) from the last decoded row's logits."""
        return sampler.sample(self._ctx)

    # ---- lifetime ------------------------------------------------------------------------------
    def sibling(self, n_ctx: int, *, swa_full: bool) -> "Engine":
        """An engine with a context and cache of its own on this engine's model (no second copy of the
        weights), one sequence only (a sliding-window cache is sized per sequence); closed with this
        one at the latest."""
        other = Engine(replace(self.config, n_ctx=n_ctx, swa_full=swa_full), model_of=self, n_seq=1)
        self._siblings.add(other)
        return other

    def close(self) -> None:
        for other in list(getattr(self, "_siblings", ())):
            other.close()
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            if self._owns_model:
                llama_cpp.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
