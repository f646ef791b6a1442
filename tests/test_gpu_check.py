"""The GPU check's plumbing on the CPU build (issue 66 item 3): the driver runs its device-path step on a
tiny Gemma 3 and writes its summary; its refusal lift is scoped; the trimmed sdist keeps what a build
reads and drops what it never does."""
from __future__ import annotations

import importlib.util
import json

from backend.protocol import CompletionRequest
from backend.ridgefill.plan import plan_prefill
from lab import gpu_check

ROOT = gpu_check.ROOT


def test_the_driver_writes_the_device_path_step_on_the_cpu(tmp_path):
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out), "--gpu-layers", "0", "--skip", "bench,fidelity"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env"]["n_gpu_layers"] == 0 and summary["device"]["cache_on_host"] is True
    assert summary["device"]["mode"] == "plumb" and summary["device"]["kl"] < 1e-8
    assert "bench" not in summary and sorted(p.name for p in out.iterdir()) == ["summary.json"]


def test_ridgefill_with_layers_on_the_gpu_runs_only_when_asked(small_engine, monkeypatch):
    """plan.ON_GPU_ENV is the product's switch the check sets (`--lift-refusal`): without it, exact and why."""
    from backend.ridgefill.plan import ON_GPU_ENV

    request = CompletionRequest(prompt="x", mode="plumb", split=18)
    monkeypatch.setattr(small_engine, "n_gpu_layers", 30)
    monkeypatch.delenv(ON_GPU_ENV, raising=False)
    refused = plan_prefill(small_engine, request, 1800)
    assert refused.mode == "off" and ON_GPU_ENV in refused.note
    monkeypatch.setenv(ON_GPU_ENV, "1")
    assert plan_prefill(small_engine, request, 1800).mode == "plumb"


def test_the_trimmed_sdist_keeps_the_sources_and_drops_the_models():
    spec = importlib.util.spec_from_file_location("make_carry", ROOT / "packaging/gpu_check/make_carry.py")
    make_carry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_carry)
    base = "llama_cpp_python-0.3.36/vendor/llama.cpp/"
    assert not make_carry.keep(base + "models/ggml-vocab-gemma-4.gguf")
    assert not make_carry.keep("llama_cpp_python-0.3.36/.git/modules/vendor/llama.cpp/objects/pack/p.pack")
    for kept in ("ggml/src/ggml-cuda/fattn.cu", "vendor/miniaudio/CMakeLists.txt", "src/llama.cpp", "CMakeLists.txt"):
        assert make_carry.keep(base + kept), kept
