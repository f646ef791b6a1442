"""What a fidelity run says, per setting against exact on the same items: mean ΔNLL of exact's replies
with a bootstrap CI and mean |ΔNLL|, the replies whose first sentence changed, accuracy on the claim, the
share of exact's (stable) right answers kept, and McNemar's p. Grouped overall, by length, by document
and by half of the long set."""
from __future__ import annotations

import numpy as np

from ..recall.scoring import same_claim
from ..recall.stats import bootstrap_ci, paired_table

EXACT = "off"
LENGTHS = ((4096, "≤4K"), (8192, "4-8K"), (16384, "8-16K"), (32768, "16-32K"))


def length_band(prompt_n: int) -> str:
    return next((name for top, name in LENGTHS if prompt_n <= top), ">32K")


def _pairs(lines: list[dict], setting: str) -> list[tuple[dict, dict]]:
    exact = {r["id"]: r for r in lines if r["setting"] == EXACT and "skipped" not in r}
    return [(exact[r["id"]], r) for r in lines
            if r["setting"] == setting and "skipped" not in r and r["id"] in exact]


def summarize(pairs: list[tuple[dict, dict]], stable: set[str] | None = None) -> dict:
    """One group's figures (see the module docstring); `stable`: ids exact answers right at both
    micro-batches (None: not measured)."""
    out: dict = {"n": len(pairs)}
    deltas = [o["nll_ref"] - e["nll_ref"] for e, o in pairs if e.get("nll_ref") is not None and o.get("nll_ref") is not None]
    if deltas:
        lo, hi = bootstrap_ci(deltas)
        out.update(dnll=float(np.mean(deltas)), dnll_lo=lo, dnll_hi=hi, abs_dnll=float(np.mean(np.abs(deltas))),
                   n_dnll=len(deltas))
    out["changed"] = sum(not same_claim(e["reply"], o["reply"]) for e, o in pairs)
    scored = [(e, o) for e, o in pairs if e.get("right") is not None]
    if scored:
        t = paired_table([bool(e["right"]) for e, _ in scored], [bool(o["right"]) for _, o in scored])
        out.update(scored=len(scored), exact_right=t["both"] + t["a_only"], right=t["both"] + t["b_only"],
                   kept=t["both"], p=t["p_mcnemar"])
        if stable is not None:
            base = [(e, o) for e, o in scored if e["id"] in stable]
            out.update(stable=len(base), stable_kept=sum(bool(o["right"]) for _, o in base))
    return out


def stable_ids(lines: list[dict]) -> set[str] | None:
    """Items exact answers right at micro-batch 512 and at 128 (None when mb128 was not run)."""
    pairs = _pairs(lines, "mb128")
    if not pairs:
        return None
    return {e["id"] for e, o in pairs if e.get("right") and o.get("right")}


def report(lines: list[dict]) -> dict:
    """{setting: {group: figures}} for every setting other than exact in `lines`; groups: "all", each
    length band, each document, each half."""
    stable = stable_ids(lines)
    out = {}
    for setting in sorted({r["setting"] for r in lines} - {EXACT}):
        pairs = _pairs(lines, setting)
        groups: dict[str, list] = {"all": pairs}
        for e, o in pairs:
            for key in (f"length {length_band(e['prompt_n'])}", f"document {e['document']}", f"half {e.get('half')}"):
                groups.setdefault(key, []).append((e, o))
        kinds = ("all", "length", "document", "half")  # the table's order: overall, then each breakdown
        bands = [name for _, name in LENGTHS] + [">32K"]
        ordered = sorted(groups, key=lambda g: (kinds.index(g.split()[0]),
                                                bands.index(g.split()[1]) if g.startswith("length") else 0, g))
        out[setting] = {g: summarize(groups[g], stable) for g in ordered}
    return out


def exact_accuracy(lines: list[dict]) -> dict:
    """Exact's own right answers over every question it was asked (a document beyond its context counts
    as unanswered)."""
    exact = [r for r in lines if r["setting"] == EXACT]
    scored = [r for r in exact if "skipped" in r or r.get("right") is not None]
    return {"n": len(scored), "right": sum(bool(r.get("right")) for r in scored),
            "skipped": sum("skipped" in r for r in scored)}


YARDSTICK = "q8"
WITHIN = 2.0  # the target: a document's mean ΔNLL at most twice q8_0's mean |ΔNLL| on the same questions


def per_document(lines: list[dict], setting: str) -> list[dict]:
    """Each document's mean ΔNLL under `setting` beside q8_0's mean |ΔNLL| on the same questions (both
    measured), and their ratio; worst ratio first. Empty when q8 was not run."""
    ours = {e["id"]: (e, o) for e, o in _pairs(lines, setting)}
    yard = {e["id"]: (e, o) for e, o in _pairs(lines, YARDSTICK)}
    by_doc: dict[str, list[tuple[float, float]]] = {}
    for i in ours.keys() & yard.keys():
        (e, o), (_, q) = ours[i], yard[i]
        if None not in (e.get("nll_ref"), o.get("nll_ref"), q.get("nll_ref")):
            by_doc.setdefault(e["document"], []).append((o["nll_ref"] - e["nll_ref"], q["nll_ref"] - e["nll_ref"]))
    rows = []
    for doc, pairs in by_doc.items():
        dnll, q8_abs = float(np.mean([d for d, _ in pairs])), float(np.mean([abs(q) for _, q in pairs]))
        rows.append({"document": doc, "n": len(pairs), "dnll": dnll, "q8_abs": q8_abs,
                     "ratio": ratio_to_yardstick(dnll, q8_abs), "within": dnll <= WITHIN * q8_abs})
    return sorted(rows, key=lambda r: -r["ratio"])


def ratio_to_yardstick(dnll: float, q8_abs: float) -> float:
    """dnll in q8_0's mean |ΔNLL|; where q8_0 moved nothing, infinite if RidgeFill moved the replies away
    and 0 if it did not."""
    if q8_abs > 0:
        return dnll / q8_abs
    return float("inf") if dnll > 0 else 0.0
