"""Tune's check beside fidelity: needles planted in the approximated bulk, exact against the chosen
setting. Fidelity chooses; the check is reported with the choice (a loss here says the maps drop a planted
fact that exact's replies to real questions did not need)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import RidgeFillError
from ..recall.run import run_recall
from .items import bulk_items
from .rules import informative, keeps_recall

LENGTH = 4096  # 2K items hardly tell SmolLM2's S = 9 from S = 12 (docs/measurements/split-tail-tune.md#tunes-items)
DEPTHS = (0.15, 0.35, 0.55)
HAYSTACKS = ("corpus", "filler")  # 3 depths x 2 haystacks, single needles: 6 items


def needle_check(engine, mode: str, split: int, tail: int, out: Path, cancel: Callable[[], bool] | None,
                 on_progress: Callable[[str, int, int], None] | None, note: Callable[[str], None],
                 max_answer_tokens: int | None = None) -> dict:
    """{"n", "exact_correct", "correct", "lost", "keeps"} ("keeps" None: exact recalls too few to judge);
    {"skipped": why} where no item lies in the bulk."""
    length = min(LENGTH, getattr(engine, "n_ctx_max", engine.n_ctx) - 64)
    try:
        items = bulk_items(engine, length, DEPTHS, ("single",), HAYSTACKS, tail, max_answer_tokens)
    except RidgeFillError as exc:
        return {"skipped": str(exc)}
    rows = {}
    for m, s in (("off", None), (mode, split)):
        stage = "needle check: exact" if m == "off" else f"needle check: {mode}:{split}"
        progress = (lambda p, stage=stage: on_progress(stage, p.done, p.total)) if on_progress else None
        try:
            lines = run_recall(engine, items, [m], s, tail, out, cancel=cancel, on_progress=progress)
        except RidgeFillError as exc:  # the check must not cost the choice it checks (Cancelled goes up)
            note(f"needle check not run: {exc}")
            return {"skipped": str(exc)}
        rows[m] = {r["id"]: bool(r["correct"]) for r in lines}
    exact, ours = rows["off"], rows[mode]
    n, exact_correct = len(items), sum(exact.values())
    lost = sum(1 for i, right in exact.items() if right and not ours.get(i))
    check = {"n": n, "exact_correct": exact_correct, "correct": sum(ours.values()), "lost": lost,
             "keeps": keeps_recall(lost, exact_correct, n)}
    judged = "" if informative(exact_correct, n) else " (exact recalls too few to judge)"
    note(f"needle check at {mode}:{split}: {check['correct']}/{n}, exact {exact_correct}/{n}, {lost} lost{judged}")
    return check
