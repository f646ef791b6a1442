"""The lab's reports as plain text: recall accuracy per condition, two result files compared, a question
set's paired report. Their tables are the product's (backend/recall/report.py)."""
from __future__ import annotations

from backend.recall.report import p_value, pct, table
from lab.evals.compare import BREAKDOWNS


def accuracy_table(acc_by_cond: dict[str, dict]) -> str:
    """Rows: overall and each breakdown value; columns: correct/n and accuracy per condition."""
    conds = list(acc_by_cond)
    keys = [("overall", None)] + [(f, k) for f in BREAKDOWNS for k in sorted(
        {k for a in acc_by_cond.values() for k in a[f]}, key=_num_first)]
    rows = []
    for f, k in keys:
        row = ["overall" if f == "overall" else f"{f} {k}"]
        for c in conds:
            g = acc_by_cond[c]["overall"] if f == "overall" else acc_by_cond[c][f].get(k)
            row += ["-", "-"] if g is None else [f"{g['correct']}/{g['n']}", pct(g["acc"])]
        rows.append(row)
    headers = ["group"] + [h for c in conds for h in (c, "acc")]
    return table(headers, rows)


def comparison_text(cmp: dict) -> str:
    rows = []
    keys = [("overall", None)] + [(f, k) for f in BREAKDOWNS for k in sorted(cmp[f], key=_num_first)]
    for f, k in keys:
        t = cmp["overall"] if f == "overall" else cmp[f][k]
        rows.append(["overall" if f == "overall" else f"{f} {k}", t["n"], pct(t["acc_a"]), pct(t["acc_b"]),
                     t["both"], t["a_only"], t["b_only"], t["neither"], p_value(t["p_mcnemar"])])
    head = f"A = {cmp['a']}   B = {cmp['b']}   paired items: {cmp['paired']}"
    if cmp["only_a"] or cmp["only_b"]:
        head += f"  (unpaired: {cmp['only_a']} only in A, {cmp['only_b']} only in B)"
    o = cmp["overall"]
    foot = (f"Disagreements: A right and B wrong {o['a_only']}, B right and A wrong {o['b_only']}; "
            f"exact two-sided McNemar p = {p_value(o['p_mcnemar'])}")
    return "\n".join([head, table(["group", "n", "A acc", "B acc", "both", "A only", "B only", "neither", "McNemar p"], rows), foot])


def _num_first(k: str):
    try:
        return (0, float(k), "")
    except ValueError:
        return (1, 0.0, k)


def questions_text(paired: dict, mode: str = "guided") -> str:
    """A question set's paired report (lab/evals/paired_questions.py): exact against `mode` per
    document, per depth and overall, where the answers `mode` lost went, and its hit rate."""
    rows = []
    for kind in ("document", "depth"):
        for key, t in sorted(paired[kind].items()):
            rows.append([key, t["n"], t["both"] + t["a_only"], t["both"] + t["b_only"], t["a_only"], t["b_only"],
                         p_value(t["p_mcnemar"])])
    o = paired["overall"]
    rows.append(["all", o["n"], o["both"] + o["a_only"], o["both"] + o["b_only"], o["a_only"], o["b_only"],
                 p_value(o["p_mcnemar"])])
    lines = [table(["group", "n", "exact right", f"{mode} right", "exact only", f"{mode} only", "McNemar p"], rows)]
    lost = paired["lost"]
    kinds = {"answer's rows not made exact": [x for x in lost if x["selected"] is False],
             "answer's rows made exact": [x for x in lost if x["selected"]]}
    lines.append(f"\nAnswers exact gave and {mode} lost: {len(lost)}")
    for what, part in kinds.items():
        rescued = sum(bool(x["rescued"]) for x in part)
        tried = sum(x["rescued"] is not None for x in part)
        lines.append(f"  {what}: {len(part)}" + (f" (the oracle, the answer's rows made exact too, answers "
                                                 f"{rescued} of {tried})" if tried else ""))
    h = paired["hit_rate"]
    if h["n"]:
        lines.append(f"Hit rate: {mode} made the answer's rows exact for {h['hits']} of {h['n']} answers in the bulk "
                     f"({pct(h['hits'] / h['n'])})")
    return "\n".join(lines)
