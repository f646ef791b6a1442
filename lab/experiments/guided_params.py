"""`python -m lab fidelity` run with guided's parameters changed (backend/ridgefill/guided.GuidedParams), e.g.
the question also scored at the first global layer above the split, whose keys the maps predict (the
plan carries them: lab/evals/plans.py):

    .venv/bin/python -m lab.experiments.guided_params [above] [budget=1024 ...] -- LAB_ARGS

`above`: the question scored at the first global layer above the split as well (its keys predicted).
"""
from __future__ import annotations

import dataclasses
import sys
from backend.ridgefill.guided import GuidedParams
from lab.evals.plans import variant


def parsed(pairs: list[str]) -> dict:
    fields = {f.name: f for f in dataclasses.fields(GuidedParams)}
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in fields:
            raise SystemExit(f"GuidedParams has no {name!r}: {', '.join(fields)}")
        default = getattr(GuidedParams(), name)
        if isinstance(default, tuple):
            out[name] = tuple(type(default[0] if default else 0.0)(x) for x in value.split(","))
        elif isinstance(default, bool):
            out[name] = value.lower() in ("1", "true", "yes")
        else:
            out[name] = type(default)(value)
    return out


@dataclasses.dataclass(frozen=True)
class ScoredAbove(GuidedParams):
    """Also the first global layer above the split scores the bulk."""

    def scoring_layers(self, n_layer: int, split: int, windowed=frozenset()) -> list[int]:
        above = [il for il in range(split + 1, n_layer) if il not in windowed][:1]
        return sorted(set(super().scoring_layers(n_layer, split, windowed)) | set(above))


def main(argv: list[str]) -> int:
    cut = argv.index("--")
    above = "above" in argv[:cut]
    overrides = parsed([a for a in argv[:cut] if a != "above"])
    kind = ScoredAbove if above else GuidedParams
    plan_for = variant(f"guided{overrides}{above}", guided=lambda plan: kind(**{**dataclasses.asdict(plan.guided),
                                                                                   **overrides}))
    print(f"guided with {overrides}{', scored above the split too' if above else ''}", file=sys.stderr, flush=True)
    from lab.cli import run_cli

    return run_cli(argv[cut + 1:], plan_for=plan_for)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
