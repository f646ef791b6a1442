"""An experiment's variant of RidgeFill is a plan: the app's own plan for the request with some of its
parts handed in (where the late inputs come from, what computes the late K/V, the maps, guided's
parameters) and a tag of its own, so no prefix or snapshot of the app's plan is reused for it.
`python -m lab fidelity` takes it through `lab.cli.run_cli(argv, plan_for=...)`; nothing in the product
is patched (tests/test_lab_builds_plans.py)."""
from __future__ import annotations

from dataclasses import replace

from backend.ridgefill.plan import RidgeFillPlan, plan_prefill


def variant(name: str, **parts):
    """plan_for(engine, request, n_tokens): the app's plan with `parts` (RidgeFillPlan's fields; a
    callable of the plan for a field whose value depends on it, e.g. `guided`) handed in and its tag
    followed by `name`; an exact plan as it is."""
    def plan_for(engine, request, n_tokens: int):
        plan = plan_prefill(engine, request, n_tokens)
        if not isinstance(plan, RidgeFillPlan):
            return plan
        given = {k: v(plan) if k in _OF_THE_PLAN and callable(v) else v for k, v in parts.items() if v is not None}
        return replace(plan, tag=f"{plan.tag}-{name}", **given)
    return plan_for


_OF_THE_PLAN = {"guided"}  # fields a variant may give as a function of the app's plan
