"""Done-when of the one-click-maps issue, on the second real model: Gemma 3 270M with no maps goes
through Get maps (nothing published: the fit path, a small capture), a tiny tune in its default mode,
speed (one candidate, one needle item, a short TTFT prompt), and a speed request that runs RidgeFill
with the fitted maps."""
from __future__ import annotations

import time

import pytest

from tests.test_ridgefill_archs import gemma3_path  # noqa: F401  (the fixture: the model assembled once)


@pytest.mark.slow
def test_gemma3_gets_maps_by_fitting_then_tunes_then_runs_speed(gemma3_path):  # noqa: F811
    from backend.completion import complete
    from backend.corpus import corpus_texts
    from backend.engine import Engine, EngineConfig
    from backend.tuning.tune import run_tune
    from backend.hub.get_maps import CaptureOptions, get_maps
    from backend.hub.settings import HubSettings
    from backend.protocol import CompletionRequest
    from backend.ridgefill import defaults
    from backend.ridgefill.activation_store import load_activations
    from backend.ridgefill.maps import MapsMissing, find_maps
    from backend.ridgefill.tuned import read_tuned
    from backend.sampling import GREEDY

    t0 = time.perf_counter()
    with pytest.raises(MapsMissing):  # a fresh user cache (RIDGEFILL_HOME is this test's): no maps at all
        find_maps(gemma3_path, 12)
    assert load_activations(gemma3_path) is None
    with Engine(EngineConfig(gemma3_path, n_ctx=2048, n_threads=2)) as engine:
        notes = []
        res = get_maps(gemma3_path, 12, HubSettings(offline=True), engine=engine, on_note=notes.append,
                       capture=CaptureOptions(max_tokens=1000, seq_tokens=500))
        assert (res.how, res.status) == ("fitted", "verified"), notes
        assert res.capture["captured_now"] and res.capture["tokens"] == 1000
        assert find_maps(gemma3_path, 12).layers == list(range(13, 18))
        t_maps = time.perf_counter() - t0

        result = run_tune(engine, splits=[12], budget_s=300, length=1600, ttft_length=1600, depths=[0.2],
                          variants=["single"], haystacks=["corpus"], max_answer_tokens=8,
                          real_per_part=0)  # real questions: tests/test_tune_realqa.py
        brief = result.brief()
        assert list(brief) == ["model", "split", "tail", "mode", "candidates"]
        # gemma3: its sliding window as the tail, and speed, its default mode (defaults.MEASURED_MODES)
        assert (brief["tail"], brief["mode"]) == (512, "speed")
        (cand,) = brief["candidates"]
        assert cand["split"] == 12 and cand["n"] == 1 and cand["ratio"] > 0
        assert result.candidates[0].mode_run == "speed" and result.candidates[0].maps == "cached"
        assert result.long_length == 0  # a 2,048-token context holds no long item
        rec = read_tuned(engine.info)
        assert rec is not None and rec["split"] == brief["split"] == defaults.default_split(engine.info)
        assert rec["mode"] == defaults.default_mode(engine.info) == "speed"
        t_tune = time.perf_counter() - t0 - t_maps

        toks = engine.tokenize(" ".join(corpus_texts()))[:1600]
        engine.slot.truncate(0)
        out = complete(engine, CompletionRequest(prompt=engine.detokenize(toks), max_tokens=2, sampling=GREEDY,
                                                 mode="speed", split=12))
        t = out.timings
        assert t.mode == "speed" and t.split == 12 and t.bulk_n >= 1024, t.note  # RidgeFill ran on the fitted maps
    print(f"gemma3: get maps (capture 1,000 tokens + fit) {t_maps:.0f} s, tune {t_tune:.0f} s, "
          f"speed TTFT {t.ttft_ms / 1000:.1f} s; tune {brief}")
