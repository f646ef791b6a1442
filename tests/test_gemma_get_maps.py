"""Done-when of the one-click-maps issue, on the second real model: Gemma 3 270M with no maps goes
through Get maps (nothing published: the fit path, a small capture), a tiny tune by fidelity (one
setting, one question about a cut judge-half document), and a speed request that runs RidgeFill with the
fitted maps."""
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

        result = run_tune(engine, splits=[12], modes=["speed"], budget_s=300, documents=["valgrind-faq.txt"],
                          doc_tokens=1800, per_doc=1, needles=False)
        brief = result.brief()
        assert list(brief) == ["model", "split", "tail", "mode", "chosen_by", "candidates", "skipped", "needles"]
        assert brief["tail"] == 512  # gemma3: its sliding window as the tail
        (cand,) = result.candidates
        assert cand.setting == "speed:12" and cand.documents[0]["n"] == 1 and cand.maps == "cached"
        rec = read_tuned(engine.info)
        # a 1,000-token capture's maps may well depart: then exact is the choice, and the defaults say so
        assert rec is not None and rec["mode"] == result.mode == defaults.default_mode(engine.info)
        assert result.mode == ("speed" if cand.keeps and not cand.refused else "off")
        t_tune = time.perf_counter() - t0 - t_maps

        toks = engine.tokenize(" ".join(corpus_texts()))[:1600]
        engine.slot.truncate(0)
        out = complete(engine, CompletionRequest(prompt=engine.detokenize(toks), max_tokens=2, sampling=GREEDY,
                                                 mode="speed", split=12))
        t = out.timings
        assert t.mode == "speed" and t.split == 12 and t.bulk_n >= 1024, t.note  # RidgeFill ran on the fitted maps
    print(f"gemma3: get maps (capture 1,000 tokens + fit) {t_maps:.0f} s, tune {t_tune:.0f} s, "
          f"speed TTFT {t.ttft_ms / 1000:.1f} s; tune {brief}")
