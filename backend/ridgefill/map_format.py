"""The map folder on disk: a manifest `ridgefill.json` plus one safetensors file per late layer.

Manifest (format version 1):
    format, format_version, credit, architecture, model_name, split, n_layer, d_in, d_out,
    map_dtype ("float16" | "int8"), int8_block, layers (l > split), lambda and heldout_cosine
    (per layer, keys are layer numbers as strings), calibration (facts of the fit), fingerprint
    (backend.ridgefill.fingerprint, K/V encodings of layers >= split), files {name: sha256}.
Layer file `layer_<l>.safetensors`: `proj.<l>.weight` (d_out, d_in), `proj.<l>.bias` (d_out);
int8 maps add `proj.<l>.weight_scale` (d_out, ceil(d_in/128)) float16 absmax scales per 128 columns.
A prediction is `h_l = weight @ h_S + bias`. README.md and other docs are never listed (a hub may
rewrite them); every listed file is a .safetensors or .json file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from backend.private_files import make_private, private_dir, write_text_private

MANIFEST = "ridgefill.json"
FORMAT = "ridgefill-maps"
FORMAT_VERSION = 1
INT8_BLOCK = 128
READABLE_SUFFIXES = (".safetensors", ".json")
CREDIT = "RidgeFill maps (closed-form ridge, unpenalized bias), after Approximate-Science/radiance-ridgefill"


def layer_file(layer: int) -> str:
    return f"layer_{layer:03d}.safetensors"


def tensor_names(layer: int) -> tuple[str, str, str]:
    return f"proj.{layer}.weight", f"proj.{layer}.bias", f"proj.{layer}.weight_scale"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def quantize_int8(w: torch.Tensor, block: int = INT8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one absmax scale per row and 128-column block."""
    d_out, d_in = w.shape
    n_blk = math.ceil(d_in / block)
    pad = n_blk * block - d_in
    wp = torch.nn.functional.pad(w.float(), (0, pad)).view(d_out, n_blk, block)
    scale = wp.abs().amax(dim=2) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale)).half()
    q = torch.round(wp / scale.float().unsqueeze(2)).clamp(-127, 127).to(torch.int8)
    return q.view(d_out, n_blk * block)[:, :d_in].contiguous(), scale


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor, block: int = INT8_BLOCK) -> torch.Tensor:
    d_out, d_in = q.shape
    s = scale.float().repeat_interleave(block, dim=1)[:, :d_in]
    return q.float() * s


def write_map_folder(
    folder: str | os.PathLike,
    *,
    split: int,
    n_layer: int,
    weights: dict[int, torch.Tensor],
    biases: dict[int, torch.Tensor],
    fingerprint: dict,
    lambdas: dict[int, float],
    heldout_cosine: dict[int, float],
    calibration: dict,
    map_dtype: str = "float16",
) -> Path:
    """Write a complete folder (into a temporary sibling, then renamed, so a reader never sees half)."""
    if map_dtype not in ("float16", "int8"):
        raise ValueError(f"map_dtype must be float16 or int8, not {map_dtype}")
    folder = Path(folder)
    private_dir(folder.parent)
    layers = sorted(weights)
    d_out, d_in = weights[layers[0]].shape
    # The staging folder is hidden (a leading dot) and never ends in -sNN, so no look-up takes it for a set.
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        files = {layer_file(l): _write_layer(tmp, l, split, weights[l], biases[l], map_dtype) for l in layers}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "credit": CREDIT,
            "architecture": fingerprint.get("architecture"),
            "model_name": fingerprint.get("name"),
            "split": split,
            "n_layer": n_layer,
            "d_in": int(d_in),
            "d_out": int(d_out),
            "map_dtype": map_dtype,
            "int8_block": INT8_BLOCK,
            "layers": layers,
            "lambda": {str(l): float(lambdas[l]) for l in layers},
            "heldout_cosine": {str(l): float(heldout_cosine[l]) for l in layers},
            "calibration": calibration,
            "fingerprint": fingerprint,
            "files": files,
        }
        write_text_private(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    except BaseException:  # a failed or interrupted write leaves nothing behind
        _rmtree(tmp)
        raise
    _replace(folder, tmp)
    return folder


def _write_layer(tmp: Path, l: int, split: int, weight: torch.Tensor, bias: torch.Tensor, map_dtype: str) -> str:
    """One layer's file in the staging folder; its sha256."""
    wn, bn, sn = tensor_names(l)
    w = weight.detach().float().cpu()
    tensors = {bn: bias.detach().float().cpu().half().contiguous()}
    if map_dtype == "int8":
        tensors[wn], tensors[sn] = quantize_int8(w)
    else:
        tensors[wn] = w.half().contiguous()
    path = tmp / layer_file(l)
    save_file(tensors, str(path), metadata={"split": str(split), "layer": str(l)})
    make_private(path)
    return sha256_file(path)


def _replace(folder: Path, staged: Path) -> None:
    """The staged folder takes the place of `folder`, replacing an older fit of the same (model, split)."""
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old")
        _rmtree(old)
        folder.rename(old)
        staged.rename(folder)
        _rmtree(old)
    else:
        staged.rename(folder)


def _rmtree(p: Path) -> None:
    import shutil

    shutil.rmtree(p, ignore_errors=True)


class FormatError(Exception):
    """A folder that does not hold a valid map set (the reason is the message)."""


MAX_LAYERS = 4096  # far above any model's layer count, so a manifest cannot make read_manifest list billions


def read_manifest(folder: Path) -> dict:
    """Parse and sanity-check `ridgefill.json` (JSON only). Raises FileNotFoundError or FormatError."""
    path = folder / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {MANIFEST}")
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:  # RecursionError: nested too deep
        raise FormatError(f"{MANIFEST} is not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from exc
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise FormatError(f"{MANIFEST} is not a RidgeFill map manifest")
    if m.get("format_version") != FORMAT_VERSION:
        raise FormatError(
            f"map format version {m.get('format_version')} is not supported (this app reads {FORMAT_VERSION}); "
            "update the app or fit the maps again"
        )
    for key, typ in (("split", int), ("n_layer", int), ("d_in", int), ("d_out", int), ("layers", list),
                     ("files", dict), ("fingerprint", dict), ("map_dtype", str)):
        if not isinstance(m.get(key), typ):
            raise FormatError(f"{MANIFEST} lacks a valid '{key}'")
    if m["map_dtype"] not in ("float16", "int8"):
        raise FormatError(f"unknown map dtype '{m['map_dtype']}'")
    if m["map_dtype"] == "int8" and m.get("int8_block") != INT8_BLOCK:
        raise FormatError(f"int8 maps need {INT8_BLOCK}-column blocks, not {m.get('int8_block')}")
    for name in m["files"]:
        if not isinstance(name, str) or Path(name).name != name or name.startswith("."):
            raise FormatError(f"the manifest lists '{name}', which is not a plain file name in the folder")
        if not name.endswith(READABLE_SUFFIXES) or name == MANIFEST:
            raise FormatError(f"the manifest lists '{name}'; only .safetensors and .json files are allowed")
    if not all(type(l) is int for l in m["layers"]) or not 0 <= m["split"] < m["n_layer"] <= MAX_LAYERS:
        raise FormatError(f"the maps' split {m['split']}, layer count {m['n_layer']} or layers are not layer numbers")
    expected = list(range(m["split"] + 1, m["n_layer"]))
    if sorted(m["layers"]) != expected:
        raise FormatError(f"the maps cover layers {m['layers']}, but split {m['split']} needs {expected}")
    for l in m["layers"]:
        if layer_file(l) not in m["files"]:
            raise FormatError(f"the manifest does not list {layer_file(l)} for layer {l}")
    return m


def verify_files(folder: Path, manifest: dict) -> list[str]:
    """Problems with the listed files: missing, or sha256 differs from the manifest."""
    problems = []
    for name, digest in manifest["files"].items():
        p = folder / name
        if not p.is_file():
            problems.append(f"file {name} is missing")
        elif sha256_file(p) != digest:
            problems.append(f"file {name} is corrupt (sha256 differs from the manifest)")
    return problems


def check_shapes(folder: Path, manifest: dict, d_model: int) -> list[str]:
    """Problems with tensor names, dtypes and shapes, read from safetensors headers only."""
    problems = []
    if manifest["d_in"] != d_model or manifest["d_out"] != d_model:
        problems.append(f"maps are {manifest['d_out']}x{manifest['d_in']}, the model's width is {d_model}")
    int8 = manifest["map_dtype"] == "int8"
    n_blk = math.ceil(d_model / INT8_BLOCK)
    for l in manifest["layers"]:
        wn, bn, sn = tensor_names(l)
        want = {wn: ((d_model, d_model), "I8" if int8 else "F16"), bn: ((d_model,), "F16")}
        if int8:
            want[sn] = ((d_model, n_blk), "F16")
        try:
            with safe_open(str(folder / layer_file(l)), framework="pt") as f:
                keys = set(f.keys())
                for name, (shape, dtype) in want.items():
                    if name not in keys:
                        problems.append(f"{layer_file(l)} lacks tensor {name}")
                        continue
                    sl = f.get_slice(name)
                    if tuple(sl.get_shape()) != shape or sl.get_dtype() != dtype:
                        problems.append(
                            f"{name} is {sl.get_dtype()} {tuple(sl.get_shape())}, expected {dtype} {shape}"
                        )
        except Exception as exc:  # safetensors raises its own error types on bad headers
            problems.append(f"{layer_file(l)} is not a readable safetensors file ({exc})")
    return problems


def read_layer(folder: Path, manifest: dict, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight float32 (d_out, d_in), bias float32 (d_out,)) of one late layer."""
    wn, bn, sn = tensor_names(layer)
    with safe_open(str(folder / layer_file(layer)), framework="pt") as f:
        w = f.get_tensor(wn)
        b = f.get_tensor(bn).float()
        if manifest["map_dtype"] == "int8":
            w = dequantize_int8(w, f.get_tensor(sn))
    return w.float(), b
