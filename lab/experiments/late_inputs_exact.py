"""Which late layers' predicted inputs move exact's replies: the fidelity run of one RidgeFill setting
with each document's bulk written from the exact model's own inputs at some late layers (an oracle,
captured by an exact pass of the bulk) and from the maps at the others.

    python -m lab.experiments.late_inputs_exact [--maps MAPS.pt] LAYERS -- LAB_ARGS

LAYERS: `maps` (the maps everywhere: the control), `global` (the global layers above the split exact,
the sliding-window ones predicted), `windowed` (the reverse), `all`, or a comma-separated list of
layers. --maps: the predicted layers from other maps (long_context_maps.py writes them). LAB_ARGS: a `python -m lab ... fidelity ...` command line whose --out file already holds exact's
lines (they are reused) and whose --modes names one RidgeFill setting. Only the documents' shared rows
(prefix_snapshot) take the oracle; the rows a question adds after them, the sliding windows written
around the rows guided makes exact, and the rows made exact themselves are as in the app.
"""
from __future__ import annotations

import sys

import torch

from backend.ridgefill import injection
from backend.ridgefill.runtime import runtime


class FileMaps:
    """Maps saved by long_context_maps.py, as the bulk pass asks them (predict_all)."""

    def __init__(self, path: str):
        saved = torch.load(path)
        self.layers = sorted(saved["weights"])
        self.weights, self.biases = saved["weights"], saved["biases"]

    def predict_all(self, h_split: torch.Tensor) -> dict[int, torch.Tensor]:
        return {il: torch.addmm(self.biases[il], h_split.float(), self.weights[il].T) for il in self.layers}


class MixedSource:
    """The exact inputs of `layers` (from the oracle), the maps' for the other late layers."""

    def __init__(self, oracle, predictor, layers: set[int]):
        self.oracle, self.predictor, self.layers = oracle, predictor, layers

    def late_inputs(self, h_split: torch.Tensor, rows: slice) -> dict[int, torch.Tensor]:
        inputs = self.predictor.late_inputs(h_split, rows)
        exact = {il: torch.from_numpy(self.oracle.streams[il][rows].astype("float32"))
                 for il in self.layers if il in self.oracle.streams}
        inputs.update(exact)
        return inputs


def chosen_layers(engine, split: int, which: str) -> set[int]:
    late = set(range(split + 1, engine.info.n_layer))
    windowed = set(runtime(engine).windows.windowed)
    named = {"maps": set(), "all": late, "global": late - windowed, "windowed": late & windowed}
    if which in named:
        return named[which]
    return {int(x) for x in which.split(",")} & late


def mixed_prefill_bulk(which: str, maps_file: str | None):
    other_maps = FileMaps(maps_file) if maps_file else None

    def prefill_bulk(engine, plan, tokens: list[int]) -> None:
        layers = chosen_layers(engine, plan.split, which)
        engine.slot.truncate(0)
        oracle = injection._oracle(engine, tokens, plan.split, None) if layers else None
        engine.slot.truncate(0)
        predictor = injection._Predictor(other_maps or plan.maps)
        source = MixedSource(oracle, predictor, layers) if layers else predictor
        print(f"bulk of {len(tokens)} rows: exact inputs at layers {sorted(layers)}, the others from "
              f"{maps_file or 'the maps'}", file=sys.stderr, flush=True)
        with injection.one_torch_thread():
            injection.bulk_pass(engine, plan, tokens, 0, len(tokens), source)
    return prefill_bulk


def main(argv: list[str]) -> int:
    maps_file = None
    if argv[:1] == ["--maps"]:
        maps_file, argv = argv[1], argv[2:]
    which, sep, lab_args = argv[0], argv[1], argv[2:]
    if sep != "--":
        raise SystemExit(__doc__)
    injection.prefill_bulk = mixed_prefill_bulk(which, maps_file)
    from lab.cli import run_cli

    return run_cli(lab_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
