"""Get maps (backend/hub/get_maps.py) on a tiny random-weight model: the fit path, a capture cancelled
halfway and resumed, no half-written map folder ever used, a short disk refused; tune's rule and JSON."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from backend.errors import Cancelled, RidgeFillError
from backend.hub.get_maps import CaptureOptions, get_maps
from backend.hub.settings import HubSettings
from backend.ridgefill import activation_store
from backend.ridgefill.capture_plan import CaptureDiskShort
from tests.tiny_gguf import write_tiny_gguf

SMALL = CaptureOptions(max_tokens=1200, seq_tokens=200)  # 6 sequences of 200 tokens


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", "llama", n_layer=4))


@pytest.fixture(scope="module")
def tiny_engine(tiny_path):
    from backend.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(tiny_path, n_ctx=512, n_threads=1))
    yield engine
    engine.close()


def settings() -> HubSettings:
    return HubSettings(offline=True)  # nothing is published for a tiny model: the fit path


def test_get_maps_fits_when_nothing_is_published_then_finds_it_cached(tiny_engine, tiny_path):
    notes, stages = [], []
    res = get_maps(tiny_path, 2, settings(), engine=tiny_engine, capture=SMALL, on_note=notes.append,
                   on_progress=lambda stage, d, t: stages.append(stage))
    assert (res.how, res.status, res.split) == ("fitted", "verified", 2)
    assert {"capture", "fit"} <= set(stages)
    assert any("needs" in n and "free" in n for n in notes)  # the disk it needs, shown before capturing
    assert res.capture["sequences"] == 6 and res.capture["resumed_sequences"] == 0
    assert get_maps(tiny_path, 2, settings(), engine=tiny_engine).how == "cached"
    again = get_maps(tiny_path, 1, settings(), engine=tiny_engine)  # another split: refitted from the capture
    assert again.how == "fitted" and again.capture["captured_now"] is False
    with pytest.raises(RidgeFillError, match="split must lie in 1..2"):
        get_maps(tiny_path, 3, settings(), engine=tiny_engine)


def test_a_cancelled_capture_resumes_and_no_half_written_folder_is_used(tiny_engine, tiny_path, monkeypatch):
    from backend.hub.maps_hub import local_map_sets
    from backend.ridgefill import map_format
    from backend.ridgefill.maps import MapsMissing, find_maps

    hs = settings()
    seen = []
    with pytest.raises(Cancelled):  # cancelled halfway through the capture (3 of 6 sequences done)
        get_maps(tiny_path, 2, hs, engine=tiny_engine, capture=SMALL, cancel=lambda: len(seen) >= 3,
                 on_progress=lambda stage, d, t: seen.append(d) if stage == "capture" and d % 200 == 0 else None)
    state = activation_store.capture_state(tiny_path)
    assert len(state["done"]) == 3 and state["sequences"] == 6
    assert activation_store.load_activations(tiny_path) is None  # an unfinished capture is never taken for one
    assert not hs.maps_dir.exists() or not any(hs.maps_dir.iterdir())  # no map folder at all

    # A fit that dies while writing (here: the third file) leaves no folder, hidden or not.
    real = map_format.save_file
    calls = []

    def failing(*a, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk went away")
        return real(*a, **kw)

    monkeypatch.setattr(map_format, "save_file", failing)
    notes = []
    with pytest.raises(OSError):
        get_maps(tiny_path, 1, hs, engine=tiny_engine, capture=SMALL, on_note=notes.append)
    monkeypatch.setattr(map_format, "save_file", real)
    assert any("resuming" in n for n in notes)
    acts = activation_store.load_activations(tiny_path)
    assert acts.facts["resumed_sequences"] == 3 and acts.facts["captured_sequences"] == 3  # fewer the second time
    assert list(hs.maps_dir.iterdir()) == []

    # A set that a killed writer left whole in its hidden staging folder is never listed or loaded ...
    res = get_maps(tiny_path, 2, hs, engine=tiny_engine)
    staged = Path(res.folder).with_name(f".{Path(res.folder).name}-killed")
    shutil.copytree(res.folder, staged)
    shutil.rmtree(res.folder)
    assert 2 not in local_map_sets(Path(tiny_path), hs)
    with pytest.raises(MapsMissing):
        find_maps(tiny_path, 2, [hs.maps_dir])
    # ... and the next Get maps removes it and fits a fresh one.
    notes = []
    res = get_maps(tiny_path, 2, hs, engine=tiny_engine, on_note=notes.append)
    assert res.how == "fitted" and not staged.exists() and any("half-written" in n for n in notes)


def test_a_capture_that_would_not_fit_the_disk_is_refused_before_it_starts(tiny_engine, tiny_path):
    with pytest.raises(CaptureDiskShort, match="Not enough disk space to capture") as err:
        get_maps(tiny_path, 2, settings(), engine=tiny_engine, capture=SMALL, disk_free=lambda p: 1000)
    assert "MB" in str(err.value) and activation_store.capture_state(tiny_path) is None


def test_maps_for_another_model_are_not_taken(tiny_engine, tiny_path, tmp_path):
    """A folder fitted for another model sits in the cache: it is refused with the reason, and Get maps
    fits this model's own."""
    from backend.ridgefill.maps import check_maps

    other = write_tiny_gguf(tmp_path / "other.gguf", "llama", n_layer=6, seed=3)
    hs = settings()
    theirs = get_maps(str(other), 2, hs, capture=SMALL)
    verdict = check_maps(theirs.folder, tiny_path)
    assert verdict.status == "refused" and "does not fit this model" in verdict.reasons[0]
    mine = get_maps(tiny_path, 2, hs, engine=tiny_engine, capture=SMALL)
    assert mine.how == "fitted" and mine.folder != theirs.folder


def test_the_decision_rule():
    from backend.tuning.tune import Candidate, candidate_splits, choose, keeps_recall, tolerance

    assert tolerance(12) == 1 and tolerance(24) == 2
    # the first number is the items lost: right exact, wrong at the split; gains elsewhere do not count
    assert keeps_recall(1, 12, 12) and keeps_recall(0, 12, 12) and not keeps_recall(2, 12, 12)
    assert keeps_recall(2, 12, 24) and not keeps_recall(3, 12, 24)
    assert not keeps_recall(0, 5, 12)  # exact recalls under half: the items cannot judge the maps
    c = lambda s, b: Candidate(s, b, 12, 12, 1.5, keeps_recall(12 - b, 12, 12))  # noqa: E731
    assert choose([c(9, 4), c(12, 11), c(15, 12)], 18, 12, 12)[0] == 12  # the lowest that keeps recall
    split, why = choose([c(9, 4), c(12, 9)], 18, 12, 12)
    assert split == 18 and "no candidate" in why
    assert choose([], 18, 3, 12)[0] == 18
    assert candidate_splits(30, 12) == [9, 12, 15, 18] and candidate_splits(18, 12) == [5, 7, 9, 11, 12]


def test_tune_judges_a_long_context_model_at_16k_too():
    from types import SimpleNamespace

    from backend.tuning.tune import LONG_LENGTH, long_length

    def eng(trained, ctx_max):
        return SimpleNamespace(info=SimpleNamespace(n_ctx_train=trained), n_ctx=4096, n_ctx_max=ctx_max)

    assert long_length(eng(32768, 32768)) == LONG_LENGTH == 16000  # Gemma 3 270M
    assert long_length(eng(8192, 8192)) == 0  # SmolLM2: trained to 8K
    assert long_length(eng(32768, 8192)) == 0  # an engine held to 8K by --ctx


def test_tune_never_offers_a_split_ridgefill_cannot_run_at():
    from types import SimpleNamespace

    from backend.errors import RidgeFillError
    from backend.tuning.tune import _checked_splits

    gemma = SimpleNamespace(n_layer=18)
    # 5 is below the global cache's first layer: the lowest candidate moves up to 6
    assert _checked_splits(None, gemma, 12, floor=6) == [6, 7, 9, 11, 12]
    with pytest.raises(RidgeFillError, match="6..16"):
        _checked_splits([5, 9], gemma, 12, floor=6)
    assert _checked_splits([9, 12], gemma, 12) == [9, 12]


def test_a_candidate_that_ran_exact_or_gains_nothing_is_refused_whatever_its_recall():
    from backend.tuning.tune import Candidate, choose, refusal
    from backend.protocol import Timings

    fast = Timings(mode="guided")
    assert refusal("guided", [{"mode_run": "guided"}] * 3, fast, 1.6) == ""
    why = refusal("guided", [{"mode_run": "guided"}, {"mode_run": "off", "note": "RidgeFill stopped (cells)"}], fast, 1.2)
    assert why.startswith("its requests ran off, not guided") and "RidgeFill stopped" in why
    assert "ran speed" in refusal("guided", [{"mode_run": "guided"}], Timings(mode="speed"), 1.6)
    assert refusal("guided", [{"mode_run": "guided"}], fast, 1.01).startswith("it gains nothing")
    assert refusal("guided", [{"mode_run": "guided"}], fast, None).startswith("it gains nothing")
    # recall as exact's, but refused: the default stays (what the tune of Gemma 3 at S = 5 did before)
    refused = Candidate(5, 10, 10, 12, 1.17, False, refused="its requests ran off, not speed")
    assert refused.brief()["refused"] and "refused" not in Candidate(9, 10, 10, 12, 1.5, True).brief()
    assert choose([refused], 12, 10, 12)[0] == 12


def test_tune_json_shape_and_the_record_drives_the_default_split(monkeypatch, capsys, tiny_path):
    from app.cli import run_cli
    from backend.tuning import tune
    from backend.model_file import read_model_info
    from backend.ridgefill import defaults
    from backend.ridgefill.tuned import read_tuned, summary, write_tuned

    info = read_model_info(tiny_path)
    assert defaults.default_split(info) == 3  # two thirds of 4 layers, untuned
    cands = [tune.Candidate(1, 2, 12, 12, 1.9, False), tune.Candidate(2, 12, 12, 12, 1.4, True)]

    def fake_run_tune(engine, **kw):
        r = tune.TuneResult(engine.info.name, 2, 256, "guided", cands, "the lowest split that keeps recall", 12, 12,
                            2048, 4096, 1000.0, 0, 1.0, kw["budget_s"])
        r.record_path = str(write_tuned(engine.info, r.record()))
        return r

    monkeypatch.setattr(tune, "run_tune", fake_run_tune)
    assert run_cli(["--model", tiny_path, "--ctx", "512", "tune", "--json", "--budget-s", "30"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["model", "split", "tail", "mode", "candidates"]
    assert out["split"] == 2 and out["candidates"][1] == {"split": 2, "bulk_correct": 12, "exact_correct": 12,
                                                          "n": 12, "lost": 0, "ratio": 1.4}
    rec = read_tuned(info)
    assert rec["split"] == 2 and defaults.default_split(info) == 2 and defaults.default_split(info, tuned=False) == 3
    assert summary(rec) == "S = 2, chosen: recall 12/12 as exact, 1.4× at 4K"
    assert run_cli(["--model", tiny_path, "tune", "--budget-s", "0"]) == 2
