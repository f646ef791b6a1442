"""plan.py's decisions on a fake engine (no model): every refusal and fallback, and what a plan holds.

The fake engine has what the planner reads: `info`, `ubatch_rows` and the RidgeFill runtime in its slot
(`ridgefill`, which runtime.runtime() hands out as it is)."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from backend.prefill import ExactPrefill
from backend.model_file import ModelInfo
from backend.protocol import CompletionRequest
from backend.ridgefill.defaults import DEFAULT_TAIL, MIN_BULK, MIN_TAIL
from backend.ridgefill.maps import MapsMissing, MapsRefused
from backend.ridgefill.plan import RidgeFillPlan, plan_prefill, plan_ridgefill, refusal
from backend.window_policy import WindowPolicy

N_LAYER = 30
SPLIT = 18  # SmolLM2's measured split (defaults.MEASURED_SPLITS), the default of the fake model below
LONG = 4000  # tokens: bulk rows to spare at any tail used here


def _info(architecture: str = "llama", n_layer: int = N_LAYER, n_embd: int = 576, sliding_window: int = 0) -> ModelInfo:
    return ModelInfo(path="fake.gguf", architecture=architecture, name="fake", n_layer=n_layer, n_embd=n_embd,
                     n_head=9, n_head_kv=3, n_ctx_train=8192, file_type=None, size_bytes=0, chat_template=None,
                     sliding_window=sliding_window)


@dataclass
class FakeMaps:
    split: int = SPLIT
    layers: tuple = tuple(range(SPLIT + 1, N_LAYER))
    folder: str = "fake-s18"
    warnings: list = field(default_factory=list)


def _windowed(layers: set[int]) -> WindowPolicy:
    return WindowPolicy(N_LAYER, window=64, windowed=frozenset(layers))


@dataclass
class FakeRuntime:
    refused: str | None = None
    windows: WindowPolicy = field(default_factory=lambda: WindowPolicy(N_LAYER))
    windows_kept: bool = True  # the engine keeps every row's sliding window (Engine.pin_seq)
    min_split: int = 1
    found: object = field(default_factory=FakeMaps)  # what maps() gives, or the exception it raises
    asked: list = field(default_factory=list)  # the splits maps() was asked for

    def maps(self, split: int):
        self.asked.append(split)
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


@dataclass
class FakeEngine:
    info: ModelInfo = field(default_factory=_info)
    ridgefill: FakeRuntime = field(default_factory=FakeRuntime)
    ubatch_rows: int = 512


def _exact_note(plan) -> str:
    assert isinstance(plan, ExactPrefill), plan
    return plan.note


# ---- refusals before any maps are looked up ---------------------------------------------------------

def test_an_unknown_mode_runs_exact():
    eng = FakeEngine()
    assert "unknown mode 'turbo'" in refusal(eng, LONG, "turbo", SPLIT, 64)
    assert "unknown mode 'off'" in _exact_note(plan_ridgefill(eng, LONG, "off", SPLIT, 64))


@pytest.mark.parametrize("split", [0, N_LAYER, -1, N_LAYER + 5])
def test_a_split_out_of_range_runs_exact(split):
    note = _exact_note(plan_ridgefill(FakeEngine(), LONG, "speed", split, 64))
    assert f"split {split} is outside 1..{N_LAYER - 1}" in note


@pytest.mark.parametrize("split", [1, N_LAYER - 1])
def test_the_splits_at_the_ends_of_the_range_are_taken(split):
    eng = FakeEngine(ridgefill=FakeRuntime(found=FakeMaps(split, tuple(range(split + 1, N_LAYER)))))
    assert refusal(eng, LONG, "speed", split, 64) is None
    assert isinstance(plan_ridgefill(eng, LONG, "speed", split, 64), RidgeFillPlan)


def test_a_tail_below_the_minimum_runs_exact():
    eng = FakeEngine()
    assert f"tail {MIN_TAIL - 1} is below the minimum {MIN_TAIL}" in refusal(eng, LONG, "speed", SPLIT, MIN_TAIL - 1)
    assert refusal(eng, LONG, "speed", SPLIT, MIN_TAIL) is None


def test_too_few_bulk_rows_run_exact():
    eng = FakeEngine()
    assert f"fewer than {MIN_BULK:,}" in refusal(eng, 64 + MIN_BULK - 1, "speed", SPLIT, 64)
    assert refusal(eng, 64 + MIN_BULK, "speed", SPLIT, 64) is None


def test_plumb_counts_its_bulk_in_whole_chunks():
    eng = FakeEngine(ubatch_rows=768)  # 64 + 1,100 tokens: speed has 1,100 bulk rows, plumb one chunk of 768
    assert refusal(eng, 64 + 1100, "speed", SPLIT, 64) is None
    assert "768 rows before the 64-token exact tail" in refusal(eng, 64 + 1100, "plumb", SPLIT, 64)


def test_a_split_below_a_cache_groups_first_layer_is_refused_up_front():
    rt = FakeRuntime(min_split=5)  # gemma3: the global cache's first layer is 5
    eng = FakeEngine(ridgefill=rt)
    why = refusal(eng, LONG, "speed", 4, 64)
    assert why and "at least 5" in why and "layer 5" in why
    assert rt.asked == [] and refusal(eng, LONG, "speed", 5, 64) is None


def test_min_split_is_the_last_cache_groups_first_layer():
    """A bulk pass cut at a group's first layer reads that group's cells from the split layer's own
    K/V writes (bulk_tap.BulkTap), so Gemma 3 can split at its first global layer."""
    from types import SimpleNamespace

    from backend.ridgefill.runtime import _min_split

    gemma = SimpleNamespace(layers={il: SimpleNamespace(k_index="g" if il in (5, 11, 17) else "s") for il in range(18)})
    assert _min_split(gemma) == 5
    one = SimpleNamespace(layers={il: SimpleNamespace(k_index="k") for il in range(30)})
    assert _min_split(one) == 1


def test_a_refused_runtime_runs_exact_with_its_reason():
    eng = FakeEngine(ridgefill=FakeRuntime(refused="RidgeFill is off: no F16 cache."))
    assert refusal(eng, LONG, "speed", SPLIT, 64) == "RidgeFill is off: no F16 cache."
    assert _exact_note(plan_ridgefill(eng, LONG, "guided", SPLIT, 64)) == "RidgeFill is off: no F16 cache."
    # the request's own faults are named first
    assert "unknown mode" in refusal(eng, LONG, "turbo", SPLIT, 64)


# ---- sliding-window layers, plumb and maps --------------------------------------------------------------

@pytest.mark.parametrize("mode", ["guided", "quality"])
def test_a_redecoding_mode_runs_as_speed_where_sliding_windows_are_evicted(mode):
    eng = FakeEngine(ridgefill=FakeRuntime(windows=_windowed({0, 1, 2}), windows_kept=False))
    plan = plan_ridgefill(eng, LONG, mode, SPLIT, 64)
    assert isinstance(plan, RidgeFillPlan) and plan.mode == "speed"
    assert "needs every row's sliding window kept" in plan.note and plan.note.endswith("ran speed.")
    kept = plan_ridgefill(FakeEngine(ridgefill=FakeRuntime(windows=_windowed({0, 1, 2}))), LONG, mode, SPLIT, 64)
    assert kept.mode == mode and kept.note == ""


def test_modes_run_as_asked_without_sliding_window_layers():
    for mode in ("speed", "quality", "guided"):
        plan = plan_ridgefill(FakeEngine(), LONG, mode, SPLIT, 64)
        assert plan.mode == mode and plan.note == ""
    plan = plan_ridgefill(FakeEngine(ridgefill=FakeRuntime(windows=_windowed({0}))), LONG, "speed", SPLIT, 64)
    assert plan.mode == "speed" and plan.note == ""


def test_plumb_needs_no_maps():
    rt = FakeRuntime(found=MapsMissing("no maps here"))
    plan = plan_ridgefill(FakeEngine(ridgefill=rt), LONG, "plumb", SPLIT, 64, write_late=False)
    assert isinstance(plan, RidgeFillPlan) and plan.mode == "plumb" and plan.maps is None
    assert plan.write_late is False and rt.asked == []


@pytest.mark.parametrize("error", [MapsMissing("no maps for split 12"), MapsRefused("a map file changed")])
def test_maps_missing_or_refused_run_exact(error):
    rt = FakeRuntime(found=error)
    note = _exact_note(plan_ridgefill(FakeEngine(ridgefill=rt), LONG, "guided", SPLIT, 64))
    assert note == f"RidgeFill maps unavailable ({error}); ran exact." and rt.asked == [SPLIT]


def test_maps_for_another_split_run_exact():
    eng = FakeEngine()
    other = FakeMaps(split=9, layers=tuple(range(10, N_LAYER)))
    assert "the maps are for split 9" in _exact_note(plan_ridgefill(eng, LONG, "speed", SPLIT, 64, maps=other))
    wrong_layers = FakeMaps(layers=tuple(range(SPLIT + 2, N_LAYER)))  # says split 18, lacks layer 19
    assert f"not split {SPLIT}" in _exact_note(plan_ridgefill(eng, LONG, "speed", SPLIT, 64, maps=wrong_layers))


def test_a_plan_carries_its_maps_tag_and_warnings():
    maps = FakeMaps(warnings=["made for another quantisation"])
    eng = FakeEngine(ridgefill=FakeRuntime(found=maps))
    plan = plan_ridgefill(eng, LONG, "quality", SPLIT, 128, share=0.25)
    assert (plan.mode, plan.split, plan.tail, plan.share) == ("quality", SPLIT, 128, 0.25)
    assert plan.maps is maps and plan.tag == "s18:fake-s18" and list(plan.warnings) == ["made for another quantisation"]
    assert plan.warnings is not maps.warnings  # the plan's own list


# ---- the request-level planner ---------------------------------------------------------------------------

def test_mode_off_runs_exact_without_a_note():
    rt = FakeRuntime(refused="never asked")
    plan = plan_prefill(FakeEngine(ridgefill=rt), CompletionRequest(prompt="x", mode="off"), LONG)
    assert isinstance(plan, ExactPrefill) and plan.note == "" and rt.asked == []


def test_a_request_gets_the_model_defaults_unless_it_asks():
    eng = FakeEngine()
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode="guided"), LONG)
    assert (plan.mode, plan.split, plan.tail) == ("guided", SPLIT, DEFAULT_TAIL)
    eng.ridgefill.found = FakeMaps(9, tuple(range(10, N_LAYER)), "fake-s09")
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode="speed", split=9, tail=256, quality_share=0.5), LONG)
    assert (plan.split, plan.tail, plan.share, plan.tag) == (9, 256, 0.5, "s9:fake-s09")
    assert eng.ridgefill.asked == [SPLIT, 9]


def test_a_request_is_refused_like_a_plan():
    note = _exact_note(plan_prefill(FakeEngine(), CompletionRequest(prompt="x", mode="speed"), 100))
    assert f"fewer than {MIN_BULK:,}" in note


def test_gemma3_gets_its_window_as_tail_and_runs_speed_by_default():
    from backend.ridgefill.defaults import SLIDING_WINDOW_TAIL, default_mode, default_split

    info = _info("gemma3", n_layer=18, n_embd=640, sliding_window=512)  # Gemma 3 270M's GGUF says 512
    split = default_split(info, tuned=False)
    maps = FakeMaps(split, tuple(range(split + 1, 18)), "gemma-s")
    eng = FakeEngine(info=info, ridgefill=FakeRuntime(windows=_windowed({0, 1, 2, 3, 4}), found=maps))
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode=default_mode(info)), LONG)
    assert (plan.mode, plan.split, plan.tail) == ("speed", split, SLIDING_WINDOW_TAIL) and plan.note == ""
    assert default_mode(_info()) == "off"  # SmolLM2: its tune chose exact (defaults.MEASURED_MODES)
    assert default_mode(_info(n_embd=512)) == "guided"  # every model the table does not name
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode="guided"), LONG)  # asked for: runs as asked
    assert plan.mode == "guided" and plan.note == ""


def test_a_tuned_record_gives_its_mode_as_well_as_its_split(tmp_path, monkeypatch):
    from backend.ridgefill import defaults, tuned

    info = _info("gemma3", n_layer=18, n_embd=640, sliding_window=512)
    monkeypatch.setattr(tuned, "maps_dir", lambda: tmp_path)
    assert defaults.default_mode(info) == "speed"
    tuned.write_tuned(info, {"split": 5, "tail": 512, "mode": "guided"})
    assert (defaults.default_split(info), defaults.default_mode(info)) == (5, "guided")
    assert defaults.default_mode(info, tuned=False) == "speed"


def test_a_model_measured_to_run_exact_does_unless_a_mode_is_asked_or_its_own_tune_says_otherwise(tmp_path, monkeypatch):
    """SmolLM2's table says exact (every setting departed on a document: docs/TUNE.md): the model's default
    runs exact and says why; a mode asked for runs, saying that it departs; the user's own tune wins."""
    from backend.protocol import MODEL_DEFAULT
    from backend.ridgefill import tuned

    monkeypatch.setattr(tuned, "maps_dir", lambda: tmp_path)
    eng = FakeEngine()  # SmolLM2's shape
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode=MODEL_DEFAULT), LONG)
    assert isinstance(plan, ExactPrefill) and eng.ridgefill.asked == []
    assert plan.note.startswith("measured: no RidgeFill setting keeps this model's replies")
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode="guided"), LONG)
    assert plan.mode == "guided" and plan.note.startswith("measured: RidgeFill moves this model's replies")
    tuned.write_tuned(eng.info, {"split": SPLIT, "tail": DEFAULT_TAIL, "mode": "guided"})
    plan = plan_prefill(eng, CompletionRequest(prompt="x", mode=MODEL_DEFAULT), LONG)
    assert (plan.mode, plan.split, plan.note) == ("guided", SPLIT, "")


def test_guided_scores_sliding_window_models_at_a_global_layer_below_the_split_or_the_first_above():
    from backend.ridgefill.guided import GuidedParams

    swa = set(range(18)) - {5, 11, 17}  # Gemma 3's global layers
    assert GuidedParams().scoring_layers(18, 9, swa) == [5]
    assert GuidedParams(layers=(0.24, 0.6)).scoring_layers(18, 13, swa) == [5, 11]
    assert GuidedParams().scoring_layers(30, 12) == [7]  # no sliding window: as the share says
    assert GuidedParams().scoring_layers(18, 5, swa) == [5]  # the split layer: keys from the exact stream
    assert GuidedParams().scoring_layers(18, 4, swa) == [5]  # none at or below 4: the first above, predicted
    assert GuidedParams().scoring_layers(18, 3, swa) == [5]
