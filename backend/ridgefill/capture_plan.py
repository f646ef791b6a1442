"""What a calibration capture will do, known before any decode: one part per sequence (its file name,
first row's counter, kept rows and bytes), the totals shown to the user, and the disk check."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from backend.disk import DISK_MARGIN
from backend.errors import RidgeFillError

from .activation_store import CACHE_VERSION
from .calibration_corpus import CalibrationSequence


def size_text(b: int) -> str:
    return f"{b / 1e9:,.2f} GB" if b >= 1e9 else f"{b / 1e6:,.1f} MB"


class CaptureDiskShort(RidgeFillError):
    """The capture's activations would not fit the free disk space (checked before it starts)."""

    def __init__(self, needed: int, free: int, where: Path):
        self.needed, self.free, self.where = needed, free, where
        super().__init__(
            f"Not enough disk space to capture calibration activations: they need {size_text(needed)} "
            f"in {where}, which has {size_text(free)} free. Free some space, or move the cache "
            f"(RIDGEFILL_CACHE_DIR or the cache location in Settings), then try again; what was captured stays."
        )


def kept_rows(n: int, counter0: int, stride: int) -> np.ndarray:
    """Which of a sequence's n rows are kept: where the running row counter is a multiple of stride."""
    return np.nonzero((counter0 + np.arange(n)) % stride == 0)[0]


def part_key(tokens: list[int], counter0: int, stride: int, layers: list[int]) -> str:
    """A part is reused only for the same rows (tokens, first counter, stride) of the same layers."""
    h = hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes())
    h.update(json.dumps([counter0, stride, layers, CACHE_VERSION]).encode())
    return h.hexdigest()[:12]


def plan_parts(seqs: list[CalibrationSequence], stride: int, layers: list[int], n_embd: int) -> list[dict]:
    """Each sequence's part (as progress.json records it): its file, first row's counter and kept rows."""
    plan, counter = [], 0
    for i, (d, kind, toks) in enumerate(seqs):
        rows = len(kept_rows(len(toks), counter, stride))
        name = f"seq-{i:04d}-{part_key(toks, counter, stride, layers)}.safetensors"
        plan.append({"index": i, "doc": d, "kind": kind, "tokens": len(toks), "counter0": counter, "rows": rows,
                     "file": name, "bytes": rows * (len(layers) * n_embd * 2 + 8)})
        counter += len(toks)
    return plan


@dataclass
class CapturePlan:
    """What a capture will do, known before it starts (shown to the user, checked against the disk)."""

    sequences: int
    tokens: int
    rows: int
    layers: int
    n_embd: int
    bytes_total: int  # every part (rows x layers x d x 2 bytes, plus doc/pos)
    done_sequences: int  # parts already on disk from an earlier, unfinished run
    bytes_left: int  # what the parts still to capture need
    disk_free: int
    folder: Path

    @classmethod
    def of(cls, parts: list[dict], done: set[str], layers: list[int], n_embd: int, disk_free: int,
           folder: Path) -> "CapturePlan":
        return cls(len(parts), sum(p["tokens"] for p in parts), sum(p["rows"] for p in parts), len(layers), n_embd,
                   sum(p["bytes"] for p in parts), len(done), sum(p["bytes"] for p in parts if p["file"] not in done),
                   int(disk_free), folder)

    def check_disk(self) -> None:
        """Raises CaptureDiskShort when the parts still to write would not leave DISK_MARGIN free."""
        if self.bytes_left and self.disk_free < self.bytes_left + DISK_MARGIN:
            raise CaptureDiskShort(self.bytes_left + DISK_MARGIN, self.disk_free, self.folder)

    def summary(self) -> str:
        gb = size_text
        text = (f"capture: {self.sequences} sequences, {self.tokens:,} tokens -> {self.rows:,} rows x "
                f"{self.layers} layers; needs {gb(self.bytes_total)} on disk")
        if self.done_sequences:
            text += (f"; resuming: {self.done_sequences} of {self.sequences} sequences already captured, "
                     f"{gb(self.bytes_left)} still to write")
        return text + f"; {gb(self.disk_free)} free"
