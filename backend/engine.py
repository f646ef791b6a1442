"""The engine: a loaded model (its tokens and chat template), the llama.cpp context made on it and that
context's slot, as llama.cpp server's `server_context` loads the model and makes its slots.

One Engine has one context at a time (backend/llama_context.py: the handle, the batch, the eval and abort
callbacks, the spare sequences) and must be used from one thread (a llama context is not thread-safe).
Its sequence 0, the conversation, is the slot's (backend/slot.py), which holds the context and calls
llama.cpp itself: the engine makes them and does not sit between them. A request goes through
backend/completion.py.
"""
from __future__ import annotations

import ctypes
import logging
import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import llama_cpp
import numpy as np

from .errors import DocumentTooLongError, EngineError, ModelFileError
from .context_size import CTX_STEP, answer_reserve, check_fits, context_cap, grown_size
from .llama_context import KV_TYPES, CancelCheck, EvalHook, LlamaContext  # noqa: F401 - KV_TYPES, CancelCheck re-exported
from .model_file import ModelInfo, read_model_info
from .protocol import AUTO_CTX, DEFAULT_N_CTX, N_BATCH
from .sampler import SamplerChain
from .slot import Slot
from .spare_sequences import SpareSequences
from .vocabulary import Vocabulary

log = logging.getLogger(__name__)

EventSink = Callable[[object], None]


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
    # RidgeFill needs flash attention (V rows laid out like K); off only for an exact engine timed against
    # it (lab/experiments/prefill_settings.py)
    flash_attn: bool = True
    # layers of the exact model on a GPU (backend/gpu_offload.py: "auto", a count, "none"); RidgeFill runs
    # exact on an engine with any
    gpu_layers: str | int = "auto"


# Sequence 0 is the conversation; 1..N_SEQ-1 serve rows decoded again (one per run, so a whole set of
# runs goes through llama.cpp in one batch: its small-batch path is slower per row,
# docs/measurements/guided-design.md#exact-rows-in-one-decode) and probes.
N_SEQ = 32


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
        from .gpu_offload import layers_to_offload

        self.n_gpu_layers = model_of.n_gpu_layers if model_of else layers_to_offload(config.gpu_layers)
        mparams.n_gpu_layers = self.n_gpu_layers
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
        self.context_generation = 0  # counts the contexts made: RidgeFill's layout belongs to one
        # Called with no argument after a context is made again (grown): what was built with the old one is
        # built again with it, before any request is planned (ridgefill.runtime.attach).
        self.on_new_context: list[Callable[[], None]] = []
        self.context: LlamaContext | None = None
        self._make_context(min(CTX_STEP, self.n_ctx_max) if self.auto_ctx else self.n_ctx_max)
        # RidgeFill's state for this engine (it outlives a grown context): read it typed through
        # backend/ridgefill/runtime.runtime(), which makes it and is its only writer. Not imported here:
        # ridgefill's map fitting makes engines, and backend has no import cycles.
        self.ridgefill: object | None = None

    def _make_context(self, n_ctx: int, grow: bool = False) -> None:
        """A new llama.cpp context of `n_ctx` tokens and its slot (sequence 0, an empty record) in place of
        the old ones (its cache is gone). When it fails, the model is freed too (the engine is dead),
        unless it was to `grow` a working engine."""
        if self.context is not None:
            self.context.close()
            self.context = None
        try:
            self.context = LlamaContext(self._model, self.config, n_ctx, self.n_seq)
        except EngineError:
            if not grow:
                if self._owns_model:
                    llama_cpp.llama_model_free(self._model)
                self._model = None
            raise
        self.n_ctx = self.context.n_ctx
        self.slot = Slot(self.context, self.pin_seq)
        self.spares = SpareSequences(self.context, range(1, self.n_seq if self.pin_seq is None else self.pin_seq))
        self.context_generation += 1
        for rebuild in self.on_new_context:  # empty while the engine is being made
            rebuild()

    @contextmanager
    def hooked(self, hook: EvalHook) -> Iterator[EvalHook]:
        """Forward the eval callback to `hook` inside the block (LlamaContext.hooked)."""
        with self.context.hooked(hook):
            yield hook

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

    # ---- rows and logits (sequence 0 is the slot's: backend/slot.py; the others are `spares`) ---------
    @property
    def ubatch_rows(self) -> int:
        """The most rows llama.cpp computes in one graph: what an eval hook sees at once (a decode of more
        rows runs as several graphs, and a hook that reads one graph's cells would miss the others')."""
        return self.context.ubatch_rows

    def row_logits(self, n_rows: int) -> np.ndarray:
        """Logits of the last decode's rows (decoded with logits_all), shape (n_rows, n_vocab)."""
        return self.context.row_logits(n_rows)

    def last_logits(self) -> np.ndarray:
        return self.context.last_logits()

    def sample(self, sampler: SamplerChain) -> int:
        """A token drawn by `sampler` (llama.cpp's chain) from the last decoded row's logits."""
        return self.context.sample(sampler)

    @contextmanager
    def scratch(self) -> Iterator["Engine"]:
        """A block that uses the context for its own rows (a capture, an eval item, a discovery decode):
        every sequence is cleared after it, whatever happens, so no later request reuses its rows."""
        try:
            yield self
        finally:
            self.slot.truncate(0)

    @property
    def llama_cpp_version(self) -> str:
        """The llama-cpp-python build whose state format the slot's state_bytes writes."""
        return llama_cpp.__version__

    # ---- lifetime ------------------------------------------------------------------------------
    def sibling(self, n_ctx: int, *, swa_full: bool, kv_type: str | None = None) -> "Engine":
        """An engine with a context and cache of its own on this engine's model (no second copy of the
        weights), one sequence only (a sliding-window cache is sized per sequence), its K/V stored as
        `kv_type` (None: as this one's); closed with this one at the latest."""
        config = replace(self.config, n_ctx=n_ctx, swa_full=swa_full, kv_type=kv_type or self.config.kv_type)
        other = Engine(config, model_of=self, n_seq=1)
        self._siblings.add(other)
        return other

    def close(self) -> None:
        for other in list(getattr(self, "_siblings", ())):
            other.close()
        if getattr(self, "context", None) is not None:
            self.context.close()
            self.context = None
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
