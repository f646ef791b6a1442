"""Verified ridge maps: load a map folder for a model, refuse or warn, and predict late-layer inputs.

`load_maps` checks, before any tensor is read: the manifest (JSON), that it lists only
.safetensors/.json files, each file's sha256, the model fingerprint (refuse: architecture, named
metadata, tokenizer; warn: name, quantisation), and each tensor's shape (from safetensors headers).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from backend.errors import RidgeFillError

from . import map_format as fmt
from .fingerprint import compare, identity_key, model_fingerprint
from .map_store import default_map_dirs, map_folder_name

log = logging.getLogger(__name__)


class MapsMissing(RidgeFillError):
    """No map folder for this model and split (fit them with `python -m app fit-maps`)."""


class MapsRefused(RidgeFillError):
    """A map folder that must not be used with this model; the message says why."""


@dataclass
class MapCheck:
    status: str  # "verified" | "warning" | "refused" | "missing"
    reasons: list[str] = field(default_factory=list)
    split: int | None = None
    folder: Path | None = None


@dataclass
class RidgeMaps:
    split: int
    n_layer: int
    layers: list[int]
    folder: Path
    warnings: list[str]
    manifest: dict
    weights: dict[int, torch.Tensor] = field(repr=False, default_factory=dict)  # (d_out, d_in) float32
    biases: dict[int, torch.Tensor] = field(repr=False, default_factory=dict)  # (d_out,) float32

    def predict(self, layer: int, h_split: torch.Tensor) -> torch.Tensor:
        """The predicted stream entering `layer` (n, d) float32 from the stream entering `split`."""
        if layer not in self.weights:
            raise KeyError(f"no map for layer {layer} (maps cover {self.layers[0]}..{self.layers[-1]})")
        return torch.addmm(self.biases[layer], h_split.float(), self.weights[layer].T)

    def predict_all(self, h_split: torch.Tensor) -> dict[int, torch.Tensor]:
        """Every late layer at once: one matmul against the stacked maps."""
        if not hasattr(self, "_stacked"):
            self._stacked = (torch.cat([self.weights[l] for l in self.layers]).T.contiguous(),
                             torch.cat([self.biases[l] for l in self.layers]))
        w, b = self._stacked
        out = torch.addmm(b, h_split.float(), w)
        return dict(zip(self.layers, out.split(self.weights[self.layers[0]].shape[0], dim=1)))


def _inspect(folder: Path, model_path) -> tuple[dict, list[str]]:
    """(manifest, warnings) of a folder that may be used with the model; raises MapsMissing/MapsRefused."""
    folder = Path(folder)
    try:
        manifest = fmt.read_manifest(folder)
    except FileNotFoundError as exc:
        raise MapsMissing(f"No map set in {folder}: {exc}. Fit maps with `python -m app fit-maps`.") from exc
    except fmt.FormatError as exc:
        raise MapsRefused(f"Map folder {folder.name} refused: {exc}.") from exc

    problems = fmt.verify_files(folder, manifest)
    if problems:
        raise MapsRefused(f"Map folder {folder.name} refused: {'; '.join(problems)}. Fit or download it again.")

    split, n_layer = manifest["split"], manifest["n_layer"]
    actual = model_fingerprint(model_path, layers=list(range(split, n_layer)))
    refuse, warn = compare(manifest["fingerprint"], actual)
    if refuse:
        raise MapsRefused(f"Map folder {folder.name} does not fit this model: {'; '.join(refuse)}.")
    d_model = actual["metadata"]["embedding_length"]
    if n_layer != actual["metadata"]["block_count"]:
        raise MapsRefused(f"Map folder {folder.name} is for {n_layer} layers, the model has "
                          f"{actual['metadata']['block_count']}.")
    shape_problems = fmt.check_shapes(folder, manifest, int(d_model))
    if shape_problems:
        raise MapsRefused(f"Map folder {folder.name} refused: {'; '.join(shape_problems)}.")
    return manifest, warn


def load_maps(folder: str | os.PathLike, model_path: str | os.PathLike) -> RidgeMaps:
    """Verify a map folder against a model and load its maps (float32, in memory)."""
    folder = Path(folder)
    manifest, warnings = _inspect(folder, model_path)
    maps = RidgeMaps(
        split=manifest["split"], n_layer=manifest["n_layer"], layers=list(manifest["layers"]),
        folder=folder, warnings=warnings, manifest=manifest,
    )
    for l in maps.layers:
        maps.weights[l], maps.biases[l] = fmt.read_layer(folder, manifest, l)
    for w in warnings:
        log.warning("maps %s: %s", folder.name, w)
    return maps


def check_maps(folder: str | os.PathLike, model_path: str | os.PathLike) -> MapCheck:
    """The verdict on a folder for a model, for the hub and the GUI. Never raises for bad folders."""
    folder = Path(folder)
    split = None
    try:
        manifest, warnings = _inspect(folder, model_path)
        split = manifest["split"]
        return MapCheck("warning" if warnings else "verified", warnings, split, folder)
    except MapsMissing as exc:
        return MapCheck("missing", [str(exc)], split, folder)
    except RidgeFillError as exc:  # MapsRefused, or a model file that cannot be read
        return MapCheck("refused", [str(exc)], split, folder)
    except Exception as exc:  # anything unexpected about the folder is a refusal, not a crash
        log.exception("checking %s failed", folder)
        return MapCheck("refused", [f"{type(exc).__name__}: {exc}"], split, folder)


def _candidates(search_dirs: list[Path], split: int, preferred: str):
    """Folders in search order: the conventional name first in each dir, then others of this split."""
    for d in search_dirs:
        d = Path(d)
        if not d.is_dir():
            continue
        if (d / preferred / fmt.MANIFEST).is_file():
            yield d / preferred
        for sub in sorted(d.iterdir()):
            if sub.name != preferred and sub.name.endswith(f"-s{split:02d}") and (sub / fmt.MANIFEST).is_file():
                yield sub


def find_maps(model_path: str | os.PathLike, split: int, search_dirs: list[Path] | None = None) -> RidgeMaps:
    """The best map set for this model and split: the first verified one, else the first that only warns.

    Raises MapsRefused when the only folders for this model (same identity) are refused (corrupt,
    wrong shape), MapsMissing when there is none at all.
    """
    search_dirs = default_map_dirs() if search_dirs is None else list(search_dirs)
    fp = model_fingerprint(model_path, layers=[])
    preferred = map_folder_name(fp, split)
    ident = identity_key(fp)
    warned: list[Path] = []
    refused: list[str] = []
    for folder in _candidates(search_dirs, split, preferred):
        verdict = check_maps(folder, model_path)
        if verdict.split != split and verdict.status in ("verified", "warning"):
            continue
        if verdict.status == "verified":
            return load_maps(folder, model_path)
        if verdict.status == "warning":
            warned.append(folder)
        elif verdict.status == "refused" and ident in folder.name:  # this model's folder, but broken
            refused.extend(verdict.reasons)
    if warned:
        return load_maps(warned[0], model_path)
    if refused:
        raise MapsRefused(" ".join(refused))
    raise MapsMissing(
        f"No RidgeFill maps for {fp.get('name')} at split {split} in "
        f"{', '.join(str(d) for d in search_dirs)}. Fit them with `python -m app fit-maps --split {split}`."
    )
