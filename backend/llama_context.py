"""One llama.cpp context on a loaded model: its handle, its batch, its eval and abort callbacks, and the
spare sequences' decodes and cells. Sequence 0 is its slot's (backend/slot.py), which holds this
context and calls llama.cpp itself, as llama.cpp server's `server_slot` holds its context.

The context is built with an eval callback (`cb_eval`) installed from the start; it asks for no node
until RidgeFill sets a hook (`hooked`), so exact runs pay nothing for it.
"""
from __future__ import annotations

import ctypes
import logging
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import llama_cpp
import numpy as np

from .errors import EngineError, Preempted
from .sampler import SamplerChain

log = logging.getLogger(__name__)

GGML_TYPE_F16 = 1
# K/V cache types a context may be made with: f16 (RidgeFill writes it), or llama.cpp's q8_0, the lossy
# cache people run every day and the yardstick of `fidelity` (backend/tuning/fidelity.py)
KV_TYPES = {"f16": GGML_TYPE_F16, "q8_0": 8}
CancelCheck = Callable[[], bool]
ABORT_POLL_S = 0.02  # an abortable decode asks its `abort` check at most this often (per graph node otherwise)


class EvalHook(Protocol):
    """What the eval callback forwards to. Must not raise (see `_on_eval`)."""

    def wants(self, tensor: int) -> bool: ...  # ask=true: compute this node and show it to me?

    def seen(self, tensor: int) -> bool: ...  # ask=false: node computed; False stops the graph


class LlamaContext:
    def __init__(self, model, config, n_ctx: int, n_seq: int):
        """A context of `n_ctx` tokens and `n_seq` sequences on `model` (EngineError if llama.cpp cannot
        make it); `config`: the engine's EngineConfig."""
        self.n_batch = config.n_batch
        self.ubatch_rows = min(config.n_batch, config.n_ubatch)  # what an eval hook sees at once
        self.n_seq = n_seq
        self.eval_hook: EvalHook | None = None
        self._eval_cb = llama_cpp.ggml_backend_sched_eval_callback(self._on_eval)  # keep a reference
        self._abort_cb = llama_cpp.ggml_abort_callback(self._on_abort_poll)  # keep a reference
        self._abort_check: CancelCheck | None = None  # set only inside an abortable decode
        self._abort_asked_at = 0.0
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = config.n_batch
        cparams.n_ubatch = min(config.n_ubatch, config.n_batch)
        # Several sequences on one unified cache: RidgeFill's quality mode decodes selected bulk rows
        # again on sequences that share sequence 0's cells, then hands the new cells to sequence 0.
        cparams.n_seq_max = n_seq
        cparams.kv_unified = True
        cparams.swa_full = config.swa_full
        cparams.n_threads = config.n_threads
        cparams.n_threads_batch = config.n_threads
        # Flash attention keeps V rows laid out like K (not transposed); F16 KV, no Hadamard rotation.
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if config.flash_attn
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.type_k = cparams.type_v = KV_TYPES[config.kv_type]
        cparams.no_perf = True
        cparams.cb_eval = self._eval_cb
        cparams.cb_eval_user_data = None
        self.handle = llama_cpp.llama_init_from_model(model, cparams)
        if not self.handle:
            raise EngineError(f"llama.cpp could not create a context of {n_ctx} tokens (out of memory?).")
        self.n_ctx = llama_cpp.llama_n_ctx(self.handle)
        self.mem = llama_cpp.llama_get_memory(self.handle)
        self._batch = llama_cpp.llama_batch_init(config.n_batch, 0, 1)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))

    # ---- eval and abort callbacks ----------------------------------------------------------------
    @contextmanager
    def hooked(self, hook: EvalHook | None) -> Iterator[EvalHook | None]:
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

    @contextmanager
    def abortable(self, abort: CancelCheck | None) -> Iterator[None]:
        """llama.cpp's abort callback asks `abort` inside the block (none is set outside it)."""
        if abort is None:
            yield
            return
        self._abort_check, self._abort_asked_at = abort, 0.0
        llama_cpp.llama_set_abort_callback(self.handle, self._abort_cb, None)
        try:
            yield
        finally:
            llama_cpp.llama_set_abort_callback(self.handle, llama_cpp.ggml_abort_callback(), None)
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

    # ---- a decode --------------------------------------------------------------------------------
    def batch(self, tokens: list[int], positions, seqs, *, logits_last: bool = False, logits_all: bool = False,
              abort: CancelCheck | None = None):
        """The llama_batch of rows with their own positions and sequences; logits for every row
        (logits_all) or the last one (logits_last), else none. An abortable one is one graph at most."""
        n = len(tokens)
        if n == 0 or n > self.n_batch:
            raise ValueError(f"decode takes 1..{self.n_batch} tokens, got {n}")
        b = self._batch
        b.n_tokens = n
        for i, (tok, pos, seq) in enumerate(zip(tokens, positions, seqs)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos, 1, logits_all
            b.seq_id[i][0] = seq
        b.logits[n - 1] = logits_last or logits_all
        if abort is not None and n > self.ubatch_rows:
            raise ValueError(f"an abortable decode takes at most {self.ubatch_rows} rows (one graph), got {n}")
        return b

    @staticmethod
    def check(rc: int, n: int, first: int, abort: CancelCheck | None = None) -> None:
        """llama_decode's return code `rc` for `n` rows from position `first`: Preempted when `abort`
        stopped it (llama.cpp took the batch's rows off their sequences again), EngineError on failure."""
        if rc == 2 and abort is not None:
            raise Preempted(f"decode of {n} rows from position {first} stopped for new work")
        if rc != 0:
            raise EngineError(f"llama_decode failed with code {rc} on {n} rows from position {first}")

    def decode_rows(self, tokens: list[int], positions, seqs: list[int], *, logits_last: bool = False,
                    logits_all: bool = False, abort: CancelCheck | None = None) -> None:
        """One llama_decode of rows onto the spare sequences (never sequence 0: that is the slot's). With
        `abort`, llama.cpp asks it between graph nodes and stops once it says so: Preempted."""
        if 0 in seqs:
            raise ValueError("sequence 0 is written through its slot (backend/slot.py)")
        batch = self.batch(tokens, positions, seqs, logits_last=logits_last, logits_all=logits_all, abort=abort)
        with self.abortable(abort):
            rc = llama_cpp.llama_decode(self.handle, batch)
        self.check(rc, len(tokens), positions[0], abort)

    # ---- spare sequences' cells, logits ----------------------------------------------------------
    def seq_copy(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Let spare sequence `dst` share `src`'s cells at positions [p0, p1) (no data moves: one cache)."""
        if dst == 0:
            raise ValueError("sequence 0 takes cells through its slot (backend/slot.py)")
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_remove(self, seq: int, p0: int, p1: int) -> None:
        """Take spare sequence `seq` off its cells at positions [p0, p1) (-1, -1: all); a cell no sequence
        holds is free."""
        if seq == 0:
            raise ValueError("sequence 0 lets go of cells through its slot (backend/slot.py)")
        if not llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1):
            raise EngineError(f"llama.cpp could not remove positions {p0}..{p1} of sequence {seq}")

    def row_logits(self, n_rows: int) -> np.ndarray:
        """Logits of the last decode's rows (decoded with logits_all), shape (n_rows, n_vocab)."""
        ptr = llama_cpp.llama_get_logits_ith(self.handle, 0)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab)).copy()

    def last_logits(self) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits_ith(self.handle, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()

    def sample(self, sampler: SamplerChain) -> int:
        """A token drawn by `sampler` (llama.cpp's chain) from the last decoded row's logits."""
        return sampler.sample(self.handle)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "handle", None):
            llama_cpp.llama_free(self.handle)
            self.handle = None
