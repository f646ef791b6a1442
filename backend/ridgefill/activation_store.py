"""The calibration activations of one model on disk: `<user cache>/activations/<fingerprint key>/`,
written by calibration.py and read by the fit. Only safetensors and JSON are written and read.

- `parts/seq-<i>-<key>.safetensors`, one per calibration sequence (`h.<il>` float16 (rows, d) per layer,
  with `scale.<il>` when the rows were divided by a power of two to fit float16's range; `doc` and `pos`
  int32 per row), each written to a temporary name and renamed when whole;
- `progress.json`, the plan (sequences, tokens, stride, the bytes it needs) and the parts done so far,
  rewritten after every part: a cancelled or killed capture continues at the first missing part;
- `calibration.json`, written last (the fingerprint and the facts: tokens, rows, stride, sequences,
  capture time, corpus digest, the parts in order): only a folder with it counts as a cache.
A part's key (capture_plan.part_key) hashes its tokens, its first row's counter, the stride and the
layers, so a part is reused only for the same rows of the same capture.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from backend.errors import RidgeFillError
from backend.private_files import make_private, private_dir, write_text_private

from .fingerprint import model_fingerprint, variant_key
from .map_store import activations_dir

FACTS = "calibration.json"
PROGRESS = "progress.json"
PARTS = "parts"
CACHE_VERSION = 2  # one safetensors part per sequence (resumable)


@dataclass
class Activations:
    """Cached activations of one model: `layer(il)` loads the stream entering il as float32."""

    folder: Path
    n_layer: int
    facts: dict
    doc: torch.Tensor  # (rows,) document id per row (held-out rows are chosen by document)
    files: list[Path]  # the safetensors holding the rows, in row order

    def layer(self, il: int) -> torch.Tensor:
        parts = []
        for path in self.files:
            with safe_open(str(path), framework="pt") as f:
                h = f.get_tensor(f"h.{il}").float()
                if f"scale.{il}" in f.keys():  # a part stored scaled down to fit float16
                    h *= f.get_tensor(f"scale.{il}").float()
                parts.append(h)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def cache_folder(model_path) -> Path:
    return activations_dir() / variant_key(model_fingerprint(model_path))


def load_activations(model_path, corpus_digest: str | None = None) -> Activations | None:
    """The cached activations of this exact model, or None (absent, unfinished, stale or unreadable);
    with `corpus_digest`, also None when they were captured from other calibration text."""
    folder = cache_folder(model_path)
    try:
        facts = json.loads((folder / FACTS).read_text(encoding="utf-8"))
        if facts.get("cache_version") != CACHE_VERSION or facts.get("fingerprint") != model_fingerprint(model_path):
            return None
        if corpus_digest is not None and facts.get("corpus_digest") != corpus_digest:
            return None
        files = [folder / PARTS / name for name in facts["parts"]]
        docs = []
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                docs.append(f.get_tensor("doc"))
    except Exception:  # any damage means "capture again"
        return None
    return Activations(folder, int(facts["n_layer"]), facts, torch.cat(docs) if len(docs) > 1 else docs[0], files)


def capture_state(model_path) -> dict | None:
    """What an unfinished capture of this model left (progress.json: the plan and the parts done), or
    None when there is none (or it is complete)."""
    folder = cache_folder(model_path)
    if (folder / FACTS).is_file():
        return None
    try:
        return json.loads((folder / PROGRESS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _half(x: np.ndarray, il: int) -> tuple[np.ndarray, float]:
    """float16 rows and the power-of-two scale they were divided by to fit its range: gemma3's residual
    stream holds values past float16's 65,504 in a few dimensions, which would become inf."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if not np.isfinite(peak):
        raise RidgeFillError(f"capture: the stream entering layer {il} holds inf or NaN; this model cannot be calibrated.")
    scale = float(2.0 ** np.ceil(np.log2(peak / 32768.0))) if peak > 32768.0 else 1.0
    return np.ascontiguousarray(x / scale if scale != 1.0 else x, dtype=np.float16), scale


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    write_text_private(tmp, json.dumps(obj, indent=1) + "\n")
    os.replace(tmp, path)


class ActivationFolder:
    """The one writer of a model's activation folder (a capture in progress)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.parts_dir = folder / PARTS

    def forget_facts(self) -> None:
        """The facts go first and come back last: a half-written cache is never trusted."""
        (self.folder / FACTS).unlink(missing_ok=True)

    def parts_present(self, names: list[str]) -> set[str]:
        return {name for name in names if (self.parts_dir / name).is_file()}

    def earlier_seconds(self, done: set[str]) -> dict[str, float]:
        """The capture time of each part in `done`, from the unfinished run that wrote it."""
        try:
            old = json.loads((self.folder / PROGRESS).read_text(encoding="utf-8"))
            return {k: v for k, v in old.get("seconds", {}).items() if k in done}
        except (OSError, ValueError):
            return {}

    def write_progress(self, progress: dict) -> None:
        private_dir(self.parts_dir)
        _write_json_atomic(self.folder / PROGRESS, progress)

    def write_part(self, name: str, streams: dict[int, np.ndarray], doc: int, pos: np.ndarray) -> None:
        """One sequence's rows (`streams[il]` for every layer, at positions `pos`), whole or not at all."""
        tensors = {}
        for il, rows in streams.items():
            tensors[f"h.{il}"], scale = _half(rows, il)
            if scale != 1.0:
                tensors[f"scale.{il}"] = np.array([scale], np.float32)
        tensors["doc"] = np.full(len(pos), doc, np.int32)
        tensors["pos"] = pos.astype(np.int32)
        tmp = self.parts_dir / f".{name}.tmp"
        save_file(tensors, str(tmp))
        make_private(tmp)
        os.replace(tmp, self.parts_dir / name)

    def remove_parts_except(self, wanted: set[str]) -> None:
        """Parts of another plan (another budget or stride) and temporary files go."""
        for stale in self.parts_dir.iterdir():
            if stale.name not in wanted:
                stale.unlink(missing_ok=True)

    def write_facts(self, facts: dict) -> None:
        _write_json_atomic(self.folder / FACTS, facts)
