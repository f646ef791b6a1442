"""Maps that see a row's context: the global layers' inputs predicted from the row's own split stream and
from averages of the rows before it (two exponential moving averages and the running mean of their
RMS-normalised split streams), still one closed-form ridge. A sliding-window layer's attention mixes in
the rows before a row, which a map from the row alone cannot see.

    .venv/bin/python -m lab.experiments.context_maps GEMMA.gguf OUT.pt [--split 5] [--layers 11,17]

Captures the prose corpus as two long prompts (long_context_maps.long_sequences), fits the row-only
ridge and the context ridge on the same rows, prints both held-out cosines (and the shipped maps'), and
writes OUT.pt for late_inputs_exact.py's `--maps` (the context maps for `--layers`, the shipped maps'
predictions for the other late layers).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from app.commands.common import int_list
from backend.engine import Engine, EngineConfig
from backend.ridgefill.fitting import fit_layers, heldout_documents, mean_cosine
from backend.ridgefill.maps import find_maps
from backend.ridgefill.stream_capture import capture_streams
from lab.experiments.long_context_maps import BLOCK_ROWS, long_sequences

DECAYS = (1 / 16, 1 / 128)  # the two moving averages' weights of the newest row
STRIDE = 4


class ContextFeatures:
    """A prompt's rows in order, block by block: each row's split stream, its moving averages and the
    running mean of the rows up to it (row 0, the attention sink, left out of the averages)."""

    def __init__(self, d: int):
        self.ema = [np.zeros(d, np.float32) for _ in DECAYS]
        self.total, self.count = np.zeros(d, np.float64), 0

    def of(self, h: np.ndarray, first_row: int) -> np.ndarray:
        normed = h / np.sqrt((h.astype(np.float64) ** 2).mean(1, keepdims=True) + 1e-6).astype(np.float32)
        out = np.empty((len(h), len(h[0]) * (2 + len(DECAYS))), np.float32)
        d = h.shape[1]
        for i, row in enumerate(normed):
            if first_row + i > 0:
                for k, a in enumerate(DECAYS):
                    self.ema[k] = (1 - a) * self.ema[k] + a * row
                self.total += row
                self.count += 1
            out[i, :d] = h[i]
            for k in range(len(DECAYS)):
                out[i, d * (1 + k): d * (2 + k)] = self.ema[k]
            out[i, d * (1 + len(DECAYS)):] = self.total / max(1, self.count)
        return out


def capture(engine, split: int, layers: list[int]):
    """Per long prompt: every row's split stream and the target layers' streams (every row)."""
    for seq in long_sequences(engine, engine.n_ctx - 64):
        yield capture_streams(engine, [seq], [split, *layers], stride=1, dtype=np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--split", type=int, default=5)
    ap.add_argument("--layers", type=int_list, default=[11, 17])
    ap.add_argument("--tokens", type=int, default=12000)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine = Engine(EngineConfig(model_path=args.model, n_ctx=args.tokens + 64, n_threads=args.threads))
    shipped = find_maps(args.model, args.split)
    t0, xs, feats, ys = time.time(), [], [], {il: [] for il in args.layers}
    for streams in capture(engine, args.split, args.layers):
        h = streams[args.split]
        keep = np.arange(len(h)) % STRIDE == 0
        xs.append(h[keep])
        feats.append(ContextFeatures(h.shape[1]).of(h, 0)[keep])
        for il in args.layers:
            ys[il].append(streams[il][keep])
        print(f"captured {len(h)} rows, {time.time() - t0:.0f} s", flush=True)
    x, f = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(feats))
    y = {il: torch.from_numpy(np.concatenate(v)) for il, v in ys.items()}
    held = heldout_documents(torch.arange(len(x)) // BLOCK_ROWS)
    row_only, context = fit_layers(x, y, held), fit_layers(f, y, held)
    for il in args.layers:
        shipped_cos = mean_cosine(shipped.predict(il, x[held]), y[il][held])
        print(f"layer {il}: held-out cosine shipped maps {shipped_cos:.4f}, row-only refit "
              f"{row_only[il].heldout_cosine:.4f}, with context {context[il].heldout_cosine:.4f}", flush=True)
    torch.save({"split": args.split, "context": True, "weights": {il: c.weight for il, c in context.items()},
                "biases": {il: c.bias for il, c in context.items()}}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


class ContextSource:
    """The bulk pass's late inputs: the context maps' for their layers, `base`'s (the shipped maps) for the
    others; one per prompt (the averages run over its rows in order)."""

    def __init__(self, saved: dict, base):
        self.weights, self.biases, self.base = saved["weights"], saved["biases"], base
        self.features: ContextFeatures | None = None

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:
        inputs = self.base.late_inputs(h_split, rows)
        if self.features is None:
            self.features = ContextFeatures(h_split.shape[1])
        f = torch.from_numpy(self.features.of(h_split.float().numpy(), rows.start))
        for il, w in self.weights.items():
            inputs[il] = torch.addmm(self.biases[il], f, w.T)
        return inputs
