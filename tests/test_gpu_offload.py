"""The GPU setting: parsed from the command line, nothing offloaded on a build without a GPU backend
(this project's CPU build), and RidgeFill running exact, saying why, on an engine with layers on a GPU
(its tensors are read through host pointers)."""
from __future__ import annotations

import pytest

from backend.gpu_offload import offload_supported, layers_to_offload, parse_gpu_layers
from backend.protocol import CompletionRequest
from backend.ridgefill.plan import plan_prefill


def test_the_setting_parses_and_a_cpu_build_offloads_nothing():
    assert [parse_gpu_layers(t) for t in ("auto", " None ", "12")] == ["auto", "none", 12]
    with pytest.raises(ValueError, match="auto, none or a number"):
        parse_gpu_layers("all")
    assert layers_to_offload("none") == 0
    if not offload_supported():  # the Makefile's build
        assert layers_to_offload("auto") == layers_to_offload(12) == 0


def test_ridgefill_runs_exact_and_says_why_while_layers_are_on_a_gpu(small_engine, monkeypatch):
    request = CompletionRequest(prompt="x", mode="plumb", split=18)
    assert plan_prefill(small_engine, request, 1800).mode == "plumb"  # the control: RidgeFill runs
    monkeypatch.setattr(small_engine, "n_gpu_layers", 30)
    monkeypatch.delenv("RIDGEFILL_ON_GPU", raising=False)
    plan = plan_prefill(small_engine, request, 1800)
    assert plan.mode == "off" and "30 layers are on the GPU" in plan.note and "ran exact" in plan.note
