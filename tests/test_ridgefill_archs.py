"""plumb == off on tiny random-weight llama / qwen2 (biases) / qwen3 (k_norm) / gemma3 (k_norm, iSWA)
GGUFs written by the test, and the control without late writes differs. F32 weights make llama.cpp
multiply in F32, so plumb is held to KL < 1e-9 (measured 1e-17..1e-13)."""
from __future__ import annotations

import numpy as np
import pytest

from backend.engine import Engine, EngineConfig
from backend.ridgefill.capture import capture_streams
from backend.ridgefill.injection import engine_state, ridgefill_prefill
from tiny_gguf import D, write_tiny_gguf  # tests/ is on sys.path (pytest prepend mode)


def _kl(p_logits, q_logits) -> float:
    p = p_logits.astype(np.float64) - p_logits.max()
    q = q_logits.astype(np.float64) - q_logits.max()
    p -= np.log(np.exp(p).sum())
    q -= np.log(np.exp(q).sum())
    return float((np.exp(p) * (p - q)).sum())


@pytest.mark.parametrize("arch,n_layer,split", [("llama", 4, 2), ("qwen2", 4, 2), ("qwen3", 4, 1), ("gemma3", 12, 7)])
def test_plumb_equals_off_on_tiny_models(tmp_path, arch, n_layer, split):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, n_layer=n_layer)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        assert engine.info.architecture == arch
        st = engine_state(engine)
        assert st.refused is None, st.refused
        if arch == "gemma3":  # two caches: global layers 5 and 11 use another cell-index input
            assert st.swa_layers == {il for il in range(12) if il % 6 != 5} and st.n_swa == 64
        rng = np.random.default_rng(1)
        toks = [1] + [int(t) for t in rng.integers(3, 299, 1600)]
        streams = capture_streams(engine, [toks[:300]], [0, split], stride=2)
        assert streams[0].shape == (150, D) and streams[split].shape == (150, D)
        engine.prefill(toks, reuse_prefix=False)
        ref = engine.last_logits()
        rep = ridgefill_prefill(engine, toks, "plumb", split, 512)
        assert rep.mode == "plumb" and rep.bulk_n == 1024, rep.note
        plumb_kl = _kl(ref, engine.last_logits())
        ridgefill_prefill(engine, toks, "plumb", split, 512, write_late=False)
        control_kl = _kl(ref, engine.last_logits())
        assert plumb_kl < 1e-9
        assert control_kl > 1000 * max(plumb_kl, 1e-15) and control_kl > 1e-9
