"""llama.cpp's own sampler chain for one answer, built from SamplingParams (backend/sampling.py).

The order is llama.cpp's (common/sampling.cpp): penalties, top-k, top-p, min-p, temperature, then a
draw (`dist`, seeded). At temperature 0 the chain is the penalties (when on) and `greedy`, which picks
the first largest logit, as numpy's argmax does: with penalties off, the same token as before.
As llama.cpp's server does, the penalties see the end of the prompt as well as the answer so far.
"""
from __future__ import annotations

import llama_cpp

from .errors import EngineError
from .sampling import SEED_MODULUS, SamplingParams

MIN_KEEP = 1  # top-p and min-p keep at least this many tokens


class SamplerChain:
    """One chain, freed when the answer is done (use it as a context manager)."""

    def __init__(self, params: SamplingParams, *, n_vocab: int, n_ctx: int):
        self._chain = None
        self.params = params.check()
        self._window = n_ctx if params.repeat_last_n < 0 else params.repeat_last_n
        cparams = llama_cpp.llama_sampler_chain_default_params()
        cparams.no_perf = True
        self._chain = llama_cpp.llama_sampler_chain_init(cparams)
        if not self._chain:
            raise EngineError("llama.cpp could not create a sampler chain")
        for smpl in self._samplers(params, n_vocab):
            llama_cpp.llama_sampler_chain_add(self._chain, smpl)  # the chain owns it from here

    def _samplers(self, p: SamplingParams, n_vocab: int) -> list:
        out = []
        if p.penalizes:
            out.append(llama_cpp.llama_sampler_init_penalties(n_vocab, self._window, p.repeat_penalty,
                                                              p.frequency_penalty, p.presence_penalty))
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

    def accept_prompt(self, tokens: list[int]) -> None:
        """The end of the prompt, as far back as the penalties look: tokens already said."""
        if self.params.penalizes:
            for tok in tokens[-self._window:]:
                llama_cpp.llama_sampler_accept(self._chain, tok)

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
