"""Activation capture and the ggml tensor view, on the embedded model (real llama.cpp)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.errors import Cancelled
from backend.ridgefill import ggml_graph
from backend.ridgefill.cache_layout import discover
from backend.ridgefill.stream_capture import capture_streams
from backend.ridgefill.kv_writer import KVWriter

TEXT = (
    "The lighthouse keeper wrote the weather down every evening, and the ships that passed learned to "
    "trust his lamp more than their charts. In the winter of the great storm he counted 4,812 waves. "
)


@pytest.fixture(scope="module")
def engine(small_engine):
    return small_engine


def _tokens(engine, n):
    toks = engine.tokenize(TEXT * 40)
    assert len(toks) >= n
    return toks[:n]


def test_layout_check_passes_on_this_build():
    assert ggml_graph.layout_problem() is None
    assert ggml_graph.GgmlTensor.data.offset == 248 and ggml_graph.GgmlTensor.name.offset == 256


def test_capture_shapes_and_stride(engine):
    n_layer, d = engine.info.n_layer, engine.info.n_embd
    seqs = [_tokens(engine, 300), _tokens(engine, 170)[5:]]
    layers = [0, 7, n_layer - 1]
    full = capture_streams(engine, seqs, layers, stride=1)
    assert set(full) == set(layers)
    for il in layers:
        assert full[il].shape == (300 + 165, d) and full[il].dtype == np.float16
        assert np.isfinite(full[il].astype(np.float32)).all()
    # Different layers hold different streams (the residual grows with depth).
    assert not np.allclose(full[0], full[7])
    strided = capture_streams(engine, seqs, layers, stride=4, on_progress=None)
    for il in layers:
        assert strided[il].shape == ((465 + 3) // 4, d)
        # A running counter over all rows picks the same rows as slicing the unstrided capture.
        np.testing.assert_allclose(strided[il].astype(np.float32), full[il][::4].astype(np.float32), atol=2e-2, rtol=2e-2)
    assert engine.slot.tokens == []  # the cache is left empty


def test_capture_progress_and_cancel(engine):
    seq = _tokens(engine, 600)
    seen = []
    capture_streams(engine, [seq], [3], on_progress=lambda done, total: seen.append((done, total)))
    assert seen[-1] == (600, 600) and len(seen) == 3  # 256-token chunks
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(Cancelled):
        capture_streams(engine, [seq], [3], cancel=cancel)
    assert engine.context.eval_hook is None  # the hook is removed even on cancel


def test_capture_rejects_bad_layers(engine):
    with pytest.raises(ValueError):
        capture_streams(engine, [[1, 2, 3]], [engine.info.n_layer])
    with pytest.raises(ValueError):
        capture_streams(engine, [[1, 2, 3]], [1], stride=0)


def _cos_rows(a, b):
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_recomputed_kv_matches_what_llama_cpp_wrote(engine):
    """K and V recomputed in torch from the captured stream match the exact engine's cache rows."""
    il = 20
    seq = _tokens(engine, 400)
    h = capture_streams(engine, [seq], [il])[il]
    layout = discover(engine)
    engine.slot.prefill(seq, reuse_prefix=False)
    ll = layout.layers[il]
    k_ref = ll.k_cache.rows()[: len(seq)].astype(np.float32)  # empty cache: cell == position
    v_ref = ll.v_cache.rows()[: len(seq)].astype(np.float32)
    writer = KVWriter(engine.info.path, layout, [il])
    k, v = writer.compute(il, torch.from_numpy(h.astype(np.float32)), torch.arange(len(seq)))
    assert _cos_rows(k.numpy(), k_ref).min() > 0.999
    assert _cos_rows(v.numpy(), v_ref).min() > 0.999
    # The same rows at the wrong positions do not match: the RoPE check can fail.
    k_shift, _ = writer.compute(il, torch.from_numpy(h.astype(np.float32)), torch.arange(len(seq)) + 7)
    assert _cos_rows(k_shift.numpy(), k_ref).mean() < 0.99
    engine.slot.truncate(0)
