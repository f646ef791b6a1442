"""Which late layers' predicted inputs move exact's replies: the fidelity run of one RidgeFill setting
with each document's bulk written from the exact model's own inputs at some late layers (an oracle,
captured by an exact pass of the bulk) and from the maps at the others.

    python -m lab.experiments.late_inputs_exact [--maps MAPS.pt] [--share F] [--keep k|v] [--local C,P]
        LAYERS -- LAB_ARGS

LAYERS: `maps` (the maps everywhere: the control), `global` (the global layers above the split exact,
the sliding-window ones predicted), `windowed` (the reverse), `all`, or a comma-separated list of
layers. --maps: the predicted layers from other maps (long_context_maps.py and context_maps.py write
them). --share F: at each of LAYERS only the share F of the rows whose predicted input is furthest
from the exact one takes the exact one (MixedSource). --keep k (v): at LAYERS only K (V) from the exact
input, the other from the prediction. --local C,P: the "exact" inputs come from the model run on
blocks of C rows, each with the P rows before it and the document's first token (global layers
see that much, not the whole document), not from one exact pass (local_streams.py).
LAB_ARGS: a `python -m lab ... fidelity ...` command line whose --out file already holds exact's lines
(they are reused) and whose --modes names one RidgeFill setting. Only the documents' shared rows
(prefix_snapshot) take the oracle; the rows a question adds after them, the sliding windows written
around the rows guided makes exact, and the rows made exact themselves are as in the app.
"""
from __future__ import annotations

import argparse
import sys

import torch

from backend.ridgefill.late_inputs import MapsInputs, TrueInputs, true_inputs
from backend.ridgefill.runtime import runtime
from lab.evals.plans import variant
from lab.experiments.local_streams import local_streams


class FileMaps:
    """Maps saved by long_context_maps.py, as the bulk pass asks them (predict_all)."""

    def __init__(self, saved: dict):
        self.layers = sorted(saved["weights"])
        self.weights, self.biases = saved["weights"], saved["biases"]

    def predict_all(self, h_split: torch.Tensor) -> dict[int, torch.Tensor]:
        return {il: torch.addmm(self.biases[il], h_split.float(), self.weights[il].T) for il in self.layers}


class MixedSource:
    """The exact inputs of `layers` (from the oracle), the maps' for the other late layers. With `share`
    below 1, only that share of each block's rows takes the exact input at a layer: those whose predicted
    input is furthest from it (relative error), the ceiling of choosing rows by the prediction's error."""

    def __init__(self, oracle, predictor, layers: set[int], share: float = 1.0):
        self.oracle, self.predictor, self.layers, self.share = oracle, predictor, layers, share

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:
        inputs = self.predictor.late_inputs(h_split, rows)
        self.predicted = dict(inputs)  # the block's predictions, for a writer that takes K or V from them
        for il in self.layers & set(self.oracle.streams):
            exact = torch.from_numpy(self.oracle.streams[il][rows].astype("float32"))
            if self.share >= 1:
                inputs[il] = exact
                continue
            error = (inputs[il] - exact).norm(dim=1) / exact.norm(dim=1).clamp_min(1e-6)
            worst = torch.topk(error, max(1, round(self.share * len(error)))).indices
            inputs[il] = inputs[il].clone()
            inputs[il][worst] = exact[worst]
        return inputs


def exact_half_only(keep: str, source_of):
    """A plan's `kv`: at the oracle's layers, only K (keep="k") or only V (keep="v") from the exact input;
    the other from the maps' prediction (the block's, stashed by MixedSource)."""
    def mixed_kv(writer, il, h, pos):
        source = source_of()
        k, v = writer.compute(il, h, pos)
        if isinstance(source, MixedSource) and il in source.layers and il in source.predicted:
            k_pred, v_pred = writer.compute(il, source.predicted[il][-len(h):], pos)
            k, v = (k, v_pred) if keep == "k" else (k_pred, v)
        return k, v
    return mixed_kv


def chosen_layers(engine, split: int, which: str) -> set[int]:
    late = set(range(split + 1, engine.info.n_layer))
    windowed = set(runtime(engine).windows.windowed)
    named = {"maps": set(), "all": late, "global": late - windowed, "windowed": late & windowed}
    if which in named:
        return named[which]
    return {int(x) for x in which.split(",")} & late


def mixed_plan(which: str, maps_file: str | None, share: float = 1.0, keep: str | None = None,
               local: tuple[int, int] | None = None):
    """plan_for: the app's plan whose shared rows (a bulk pass from row 0) take `which` layers' inputs from
    an oracle and the others from the maps (or `maps_file`'s); a question's own rows as in the app."""
    saved = torch.load(maps_file) if maps_file else None
    other_maps = FileMaps(saved) if saved is not None and not saved.get("context") else None
    current = {"source": None}  # the source of the pass in progress, for `keep`'s K/V

    def inputs(engine, plan, bulk: list[int], start: int, cancel):
        predictor = MapsInputs(plan.maps)
        if start > 0:
            current["source"] = predictor
            return predictor
        layers = chosen_layers(engine, plan.split, which)
        if layers and local:
            oracle = TrueInputs(local_streams(engine, bulk, sorted(layers), *local))
        else:
            oracle = true_inputs(engine, bulk, plan.split, cancel) if layers else None
        predictor = MapsInputs(other_maps or plan.maps)
        if saved is not None and saved.get("context"):  # context_maps.py: one source per prompt
            from lab.experiments.context_maps import ContextSource

            predictor = ContextSource(saved, predictor)
        current["source"] = MixedSource(oracle, predictor, layers, share) if layers else predictor
        source_name = "by-block" if local else "exact"
        print(f"bulk of {len(bulk)} rows: {source_name} inputs at layers {sorted(layers)}, the others from "
              f"{maps_file or 'the maps'}", file=sys.stderr, flush=True)
        return current["source"]

    kv = exact_half_only(keep, lambda: current["source"]) if keep else None
    return variant(f"oracle-{which}-{share}-{keep}-{local}-{maps_file}", inputs=inputs, kv=kv)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], usage=" ".join(line.strip() for line in __doc__.splitlines()[4:6]))
    ap.add_argument("--maps", default=None)
    ap.add_argument("--share", type=float, default=1.0)
    ap.add_argument("--keep", choices=["k", "v"], default=None)
    ap.add_argument("--local", default=None, type=lambda v: tuple(int(x) for x in v.split(",")))
    ap.add_argument("layers")
    ap.add_argument("lab_args", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    lab_args = args.lab_args[1:] if args.lab_args[:1] == ["--"] else args.lab_args
    from lab.cli import run_cli

    return run_cli(lab_args, plan_for=mixed_plan(args.layers, args.maps, args.share, args.keep, args.local))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
