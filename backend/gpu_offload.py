"""Which layers the exact model puts on a GPU: the setting ("auto", a count, or "none") against what this
llama.cpp build can offload. The default build (the Makefile) is CPU-only, so "auto" offloads nothing
there; a CUDA, Metal or Vulkan build (CMAKE_ARGS, docs/USAGE.md) offloads every layer that fits.
RidgeFill reads and writes the model's tensors through host pointers, so a request whose engine has
layers on a GPU runs exact and says why (plan.refusal)."""
from __future__ import annotations

import llama_cpp

AUTO, NONE = "auto", "none"
ALL_LAYERS = 999  # llama.cpp's way of saying "every layer" (it caps the count at the model's)


def offload_supported() -> bool:
    return bool(llama_cpp.llama_supports_gpu_offload())


def parse_gpu_layers(text: str) -> str | int:
    """auto | none | a count of layers; ValueError for anything else."""
    text = text.strip().lower()
    if text in (AUTO, NONE):
        return text
    if text.isdigit():
        return int(text)
    raise ValueError(f"--gpu-layers takes auto, none or a number of layers, not {text!r}")


def layers_to_offload(setting: str | int) -> int:
    """The n_gpu_layers llama.cpp is given: none on a build without GPU offload, whatever the setting."""
    if not offload_supported() or setting == NONE:
        return 0
    return ALL_LAYERS if setting == AUTO else int(setting)


def build_line() -> str:
    """What `info` and the engine line say about the GPU."""
    if offload_supported():
        return "this llama.cpp build can offload layers to a GPU"
    return "CPU only (this llama.cpp build has no GPU backend; see docs/USAGE.md to build one)"
