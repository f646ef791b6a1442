"""One layer's K and V for bulk rows fitted directly: a ridge from the split stream to the layer's K before
its K-norm and RoPE, and to its V, instead of the layer's input predicted and then projected.

    .venv/bin/python -m lab.experiments.direct_kv fit GEMMA.gguf OUT.pt [SPLIT LAYER]   (default 5 11)
    .venv/bin/python -m lab.experiments.direct_kv fidelity OUT.pt [k|v|kv] -- LAB_ARGS
    .venv/bin/python -m lab.experiments.direct_kv temper ALPHA LAYER -- LAB_ARGS
    .venv/bin/python -m lab.experiments.direct_kv features GEMMA.gguf [N]   (N random ReLU features, 2048)

`fit` captures the prose corpus as two long prompts (long_context_maps.long_sequences), fits on held-out
blocks as the app fits its maps, and prints per held-out row the cosine to the exact K (after K-norm) and
V of both paths. `fidelity` runs a `python -m lab ... fidelity` command line whose documents' bulk rows
take that layer's K, V or both from the direct fit (the other layers, and the other half, as in the app).
`features` fits K and V of layer 11 from the split stream and N random ReLU features of it (still one
closed-form ridge, a non-linear one) and prints the held-out cosines as `fit` does.
`temper` writes that layer's predicted K times ALPHA for the bulk rows (the rows guided makes exact are
written again, exact): a predicted key that happens to match a query draws less attention.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import torch

from backend.engine import Engine, EngineConfig
from backend.ridgefill.fitting import fit_layers, heldout_documents, mean_cosine
from backend.ridgefill.kv_writer import apply_rope, quantized_matmul, rms_norm
from backend.ridgefill.late_inputs import MapsInputs
from backend.ridgefill.maps import find_maps
from backend.ridgefill.runtime import runtime
from backend.ridgefill.stream_capture import capture_streams
from lab.evals.plans import variant
from lab.experiments.long_context_maps import BLOCK_ROWS, long_sequences

STRIDE = 4


def raw_kv(writer, il: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer il's K before its K-norm and RoPE, and its V, for input streams h (the writer's own path)."""
    w = writer.weights[il]
    x = rms_norm(h.float(), w.attn_norm, writer.eps)
    k, v = quantized_matmul(x, w.wk, w.k_act, w.k_min), quantized_matmul(x, w.wv, w.v_act, w.v_min)
    return (k if w.bk is None else k + w.bk), (v if w.bv is None else v + w.bv)


def normed_k(writer, il: int, k_raw: torch.Tensor) -> torch.Tensor:
    w, ll = writer.weights[il], writer.layout.layers[il]
    k = k_raw.view(-1, ll.n_head_kv, ll.head_dim_k)
    return (k if w.k_norm is None else rms_norm(k, w.k_norm, writer.eps)).reshape(len(k_raw), -1)


def fit(model: str, out: str, split: int = 5, layer: int = 11, tokens: int = 12000) -> int:
    engine = Engine(EngineConfig(model_path=model, n_ctx=tokens + 64, n_threads=2))
    writer, maps, t0 = runtime(engine).writer, find_maps(model, split), time.time()
    xs, hs = [], []
    for seq in long_sequences(engine, tokens):
        got = capture_streams(engine, [seq], [split, layer], stride=STRIDE, dtype=np.float32)
        xs.append(got[split])
        hs.append(got[layer])
        print(f"captured {len(seq)} tokens, {time.time() - t0:.0f} s", flush=True)
    x, h = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(hs))
    k_raw, v = raw_kv(writer, layer, h)
    blocks = torch.arange(len(x)) // BLOCK_ROWS
    held = heldout_documents(blocks)
    train = ~held  # the direct fit is judged on rows it never saw (its λ chosen inside the training rows)
    fits = fit_layers(x[train], {0: k_raw[train], 1: v[train]}, heldout_documents(blocks[train], offset=0))
    kp, vp = raw_kv(writer, layer, maps.predict(layer, x[held]))
    kd = torch.addmm(fits[0].bias, x[held], fits[0].weight.T)
    vd = torch.addmm(fits[1].bias, x[held], fits[1].weight.T)
    k_true = normed_k(writer, layer, k_raw[held])
    print(f"layer {layer}, {int(held.sum())} held-out rows: K cosine maps {mean_cosine(normed_k(writer, layer, kp), k_true):.4f}"
          f" direct {mean_cosine(normed_k(writer, layer, kd), k_true):.4f}; V cosine maps "
          f"{mean_cosine(vp, v[held]):.4f} direct {mean_cosine(vd, v[held]):.4f}", flush=True)
    fits = fit_layers(x, {0: k_raw, 1: v}, held)  # the saved fit: every row (fit_layers' final weights)
    torch.save({"split": split, "layer": layer, "k": (fits[0].weight, fits[0].bias),
                "v": (fits[1].weight, fits[1].bias)}, out)
    return 0


def fit_features(model: str, n_features: int = 2048, split: int = 5, layer: int = 11, tokens: int = 12000) -> int:
    engine = Engine(EngineConfig(model_path=model, n_ctx=tokens + 64, n_threads=2))
    writer, maps = runtime(engine).writer, find_maps(model, split)
    xs, hs = [], []
    for seq in long_sequences(engine, tokens):
        got = capture_streams(engine, [seq], [split, layer], stride=2, dtype=np.float32)
        xs.append(got[split])
        hs.append(got[layer])
    x, h = torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(hs))
    k_raw, v = raw_kv(writer, layer, h)
    scaled = rms_norm(x, torch.ones(x.shape[1]), writer.eps)  # the features see the direction, not the norm
    r = torch.randn(x.shape[1], n_features, generator=torch.Generator().manual_seed(0)) / x.shape[1] ** 0.5
    f = torch.cat([x, torch.relu(scaled @ r)], dim=1)
    blocks = torch.arange(len(x)) // (BLOCK_ROWS * 2)
    held = heldout_documents(blocks)
    train = ~held
    k_true = normed_k(writer, layer, k_raw[held])
    kp, vp = raw_kv(writer, layer, maps.predict(layer, x[held]))
    print(f"{len(x)} rows, {int(held.sum())} held out; maps: K {mean_cosine(normed_k(writer, layer, kp), k_true):.4f}, "
          f"V {mean_cosine(vp, v[held]):.4f}", flush=True)
    for name, inputs in (("row only", x), (f"with {n_features} ReLU features", f)):
        fits = fit_layers(inputs[train], {0: k_raw[train], 1: v[train]}, heldout_documents(blocks[train], offset=0))
        kd = torch.addmm(fits[0].bias, inputs[held], fits[0].weight.T)
        vd = torch.addmm(fits[1].bias, inputs[held], fits[1].weight.T)
        print(f"direct, {name}: K {mean_cosine(normed_k(writer, layer, kd), k_true):.4f}, "
              f"V {mean_cosine(vd, v[held]):.4f}", flush=True)
    return 0


class StashSplit:
    """The shared rows' source, keeping each block's split stream for the plan's `kv`."""

    def __init__(self, base):
        self.base, self.h = base, None

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:
        self.h = h_split.float()
        return self.base.late_inputs(h_split, rows)


def direct_kv(saved: dict, source_of, which: str):
    """A plan's `kv`: the layer's own K and V, but the saved layer's from the direct fit while the shared
    rows are written (their source a StashSplit)."""
    il = saved["layer"]

    def with_direct(writer, layer, h, pos):
        k, v = writer.compute(layer, h, pos)
        source = source_of()
        if layer == il and isinstance(source, StashSplit) and source.h is not None and len(source.h) == len(h):
            ll = writer.layout.layers[il]
            if "k" in which:
                k_raw = torch.addmm(saved["k"][1], source.h, saved["k"][0].T)
                k = apply_rope(normed_k(writer, il, k_raw).view(-1, ll.n_head_kv, ll.head_dim_k), ll.rope, pos)
                k = k.reshape(len(h), -1)
            if "v" in which:
                v = torch.addmm(saved["v"][1], source.h, saved["v"][0].T)
        return k, v
    return with_direct


def tempered_kv(il: int, alpha: float, source_of):
    """A plan's `kv`: layer il's predicted K times `alpha` while the shared rows are written."""
    def tempered(writer, layer, h, pos):
        k, v = writer.compute(layer, h, pos)
        if layer == il and isinstance(source_of(), StashSplit):
            k = k * alpha
        return k, v
    return tempered


def fidelity(saved_path: str, which: str, lab_args: list[str], temper: tuple[float, int] | None = None) -> int:
    saved = torch.load(saved_path) if temper is None else None
    current = {"source": None}

    def inputs(engine, plan, bulk, start, cancel):  # noqa: ARG001
        current["source"] = StashSplit(MapsInputs(plan.maps)) if start == 0 else MapsInputs(plan.maps)
        if start == 0:
            what = f"K times {temper[0]}" if temper else f"{which} fitted directly"
            print(f"bulk of {len(bulk)} rows: layer {temper[1] if temper else saved['layer']}'s {what}",
                  file=sys.stderr, flush=True)
        return current["source"]

    def source_of():
        return current["source"]

    kv = tempered_kv(temper[1], temper[0], source_of) if temper else direct_kv(saved, source_of, which)
    from lab.cli import run_cli

    name = f"temper{temper}" if temper else f"direct-{which}-{saved_path}"
    return run_cli(lab_args, plan_for=variant(name, inputs=inputs, kv=kv))


def main(argv: list[str]) -> int:
    if argv[:1] == ["fit"]:
        return fit(argv[1], argv[2], *[int(a) for a in argv[3:5]])
    if argv[:1] == ["fidelity"] and "--" in argv:
        cut = argv.index("--")
        which = argv[2] if cut > 2 else "kv"
        return fidelity(argv[1], which, argv[cut + 1:])
    if argv[:1] == ["features"]:
        return fit_features(argv[1], *[int(a) for a in argv[2:3]])
    if argv[:1] == ["temper"] and "--" in argv:
        cut = argv.index("--")
        return fidelity("", "k", argv[cut + 1:], temper=(float(argv[1]), int(argv[2])))
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
