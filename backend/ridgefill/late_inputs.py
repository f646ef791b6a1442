"""Where the bulk rows' late layers' inputs come from: the ridge maps' predictions from the stream entering
the split (speed, quality, guided), the exact model's own streams (plumb), or whatever a plan hands in
(`RidgeFillPlan.inputs`: the lab's oracles and variants are plans, never patches).

A source answers `late_inputs(h_split, rows)`: each late layer's input for the rows whose split stream is
`h_split`, `rows` their positions in the prompt.
"""
from __future__ import annotations

import numpy as np
import torch

from .stream_capture import capture_streams


class TrueInputs:
    """plumb: the true late-layer inputs from an exact capture, served block by block."""

    def __init__(self, streams: dict[int, np.ndarray]):
        self.streams = streams

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        return {l: torch.from_numpy(np.ascontiguousarray(s[rows], dtype=np.float32)) for l, s in self.streams.items()}


class MapsInputs:
    """speed, quality, guided: the ridge maps' predictions from the stream entering the split."""

    def __init__(self, maps):
        self.maps = maps

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:  # noqa: ARG002
        if hasattr(self.maps, "predict_all"):
            return self.maps.predict_all(h_split)
        return {l: self.maps.predict(l, h_split) for l in self.maps.layers}


def true_inputs(engine, bulk: list[int], split: int, cancel=None) -> TrueInputs:
    """The exact model's streams entering every late layer for `bulk`, decoded on sequence 0 (which the
    caller empties after; float32: a float16 stream alone costs ~5e-4 relative error in every K/V row)."""
    late = list(range(split + 1, engine.info.n_layer))
    return TrueInputs(capture_streams(engine, [bulk], late, cancel=cancel, dtype=np.float32) if late else {})


def source_for(engine, plan, bulk: list[int], start: int, cancel=None):
    """The source of the late inputs of rows bulk[start:] (sequence 0 holds the first `start`): the plan's
    own (`plan.inputs(engine, plan, bulk, start, cancel)`), plumb's true streams, else the maps'. Only with
    `start` 0 may a source decode on sequence 0 to capture (the caller empties it after): a capture with
    rows held would lose them (capture_streams empties the context)."""
    if plan.inputs is not None:
        return plan.inputs(engine, plan, bulk, start, cancel)
    if plan.mode == "plumb":
        return true_inputs(engine, bulk, plan.split, cancel)
    return MapsInputs(plan.maps)
