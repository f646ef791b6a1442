"""llama.cpp's own sampler chain for one answer, built from SamplingParams (backend/sampling.py).

The order is llama.cpp's (common/sampling.cpp): penalties, DRY, top-k, top-p, min-p, temperature, then
a draw (`dist`, seeded). At temperature 0 the chain is the penalties and DRY (when on) and `greedy`,
which picks the first largest logit, as numpy's argmax does: with both off, the same token as before.
The penalties and DRY count the answer's own tokens only, not the prompt's (llama.cpp's server counts both):
an answer about a document restates its question, and with the question's words penalized the embedded
model wrote "The code of the vault refers to..." where it had answered "...is 4729185"
(docs/measurements/sampling.md#sampling-defaults).
"""
from __future__ import annotations

import ctypes

import llama_cpp

from .errors import EngineError
from .sampling import SEED_MODULUS, SamplingParams

MIN_KEEP = 1  # top-p and min-p keep at least this many tokens


class SamplerChain:
    """One chain, freed when the answer is done (use it as a context manager)."""

    def __init__(self, params: SamplingParams, *, n_vocab: int, n_ctx: int, vocab=None):
        self._chain = None
        self.params = params.check()
        cparams = llama_cpp.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(cparams)
        if not self._chain:
            raise EngineError("llama.cpp could not create a sampler chain")
        if params.dry and vocab is None:
            raise EngineError("DRY needs the model's vocabulary")
        for smpl in self._samplers(params, n_vocab, n_ctx, vocab):
            llama_cpp.llama_sampler_chain_add(self._chain, smpl)  # the chain owns it from here

    @staticmethod
    def _samplers(p: SamplingParams, n_vocab: int, n_ctx: int, vocab) -> list:
        out = []
        if p.penalizes:
            window = n_ctx if p.repeat_last_n < 0 else p.repeat_last_n
            out.append(llama_cpp.llama_sampler_init_penalties(n_vocab, window, p.repeat_penalty,
                                                              p.frequency_penalty, p.presence_penalty))
        if p.dry:
            # llama.cpp's library reads a negative window as 0 (off); its server, as here, as the context
            window = n_ctx if p.dry_penalty_last_n < 0 else p.dry_penalty_last_n
            breakers = [b.encode("utf-8") for b in p.dry_sequence_breakers]
            array = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)  # llama.cpp copies them
            out.append(llama_cpp.llama_sampler_init_dry(vocab, p.dry_multiplier, p.dry_base, p.dry_allowed_length,
                                                        window, array, len(breakers)))
        if p.greedy:
            return out + [llama_cpp.llama_sampler_init_greedy()]
        if p.top_k > 0:
            out.append(llama_cpp.llama_sampler_init_top_k(p.top_k))
        if p.top_p < 1.0:
            out.append(llama_cpp.llama_sampler_init_top_p(p.top_p, MIN_KEEP))
        if p.min_p > 0.0:
            out.append(llama_cpp.llama_sampler_init_min_p(p.min_p, MIN_KEEP))
        out.append(llama_cpp.llama_sampler_init_temp(p.temperature))
        seed = llama_cpp.LLAMA_DEFAULT_SEED if p.seed < 0 else p.seed % SEED_MODULUS
        return out + [llama_cpp.llama_sampler_init_dist(seed)]

    def sample(self, ctx) -> int:
        """The next token from the last decoded row's logits in `ctx`; the chain accepts it."""
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, -1))

    def close(self) -> None:
        if getattr(self, "_chain", None):
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    def __enter__(self) -> "SamplerChain":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass
