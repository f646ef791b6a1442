"""Get maps (backend/hub/get_maps.py) on a tiny random-weight model: the fit path, a capture cancelled
halfway and resumed, no half-written map folder ever used, a short disk refused; tune's candidates and JSON."""
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


def test_tune_candidates_span_the_layers_from_the_lowest_split_ridgefill_can_run_at():
    from types import SimpleNamespace

    from backend.errors import RidgeFillError
    from backend.tuning.tune import _checked_splits, candidate_splits

    assert candidate_splits(30, 18) == [9, 12, 18, 21, 24]  # SmolLM2: the splits whose maps ship
    assert candidate_splits(18, 11) == [5, 7, 11, 13, 14]  # Gemma 3 270M
    gemma = SimpleNamespace(n_layer=18)
    # 5 is below the global cache's first layer: the lowest candidate moves up to 6
    assert _checked_splits(None, gemma, 11, floor=6) == [6, 7, 11, 13, 14]
    with pytest.raises(RidgeFillError, match="6..16"):
        _checked_splits([5, 9], gemma, 11, floor=6)
    assert _checked_splits([12, 9, 12], gemma, 11) == [9, 12]


def test_tune_json_shape_and_the_record_drives_the_default_split(monkeypatch, capsys, tiny_path):
    from app.cli import run_cli
    from backend.tuning import tune
    from backend.model_file import read_model_info
    from backend.ridgefill import defaults
    from backend.ridgefill.tuned import read_tuned, summary, write_tuned

    info = read_model_info(tiny_path)
    assert defaults.default_split(info) == 3  # two thirds of 4 layers, untuned
    docs = [{"document": "a.txt", "n": 4, "dnll": 0.01, "q8_abs": 0.02, "ratio": 0.5, "within": True}]
    cands = [tune.Candidate("speed:1", "speed", 1, [{**docs[0], "dnll": 0.2, "ratio": 10.0, "within": False}], False, 2.5),
             tune.Candidate("speed:2", "speed", 2, docs, True, 1.4)]

    def fake_run_tune(engine, **kw):
        r = tune.TuneResult(engine.info.name, 2, 256, "speed", cands, "the fastest setting that keeps", {"a.txt": 2000},
                            4, 8192, 1.0, kw["budget_s"])
        r.record_path = str(write_tuned(engine.info, r.record()))
        return r

    monkeypatch.setattr(tune, "run_tune", fake_run_tune)
    assert run_cli(["--model", tiny_path, "--ctx", "512", "tune", "--json", "--budget-s", "30"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["model", "split", "tail", "mode", "chosen_by", "candidates", "skipped", "needles"]
    assert out["split"] == 2 and out["candidates"][1] == {"setting": "speed:2", "keeps": True, "ratio": 1.4,
                                                          "worst_document": "a.txt", "worst_ratio": 0.5, "documents": 1}
    rec = read_tuned(info)
    assert rec["split"] == 2 and defaults.default_split(info) == 2 and defaults.default_split(info, tuned=False) == 3
    assert defaults.default_mode(info) == "speed"
    assert summary(rec) == ("speed at S = 2, worst of 1 documents a.txt at 0.5× q8_0's distance from exact's replies, "
                            "1.40× exact's speed")
    assert run_cli(["--model", tiny_path, "tune", "--budget-s", "0"]) == 2
