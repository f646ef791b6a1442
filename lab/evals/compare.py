"""Accuracy breakdowns and the paired comparison of two conditions (e.g. off vs speed) on the same items."""
from __future__ import annotations

from collections import defaultdict

from backend.recall.stats import paired_table

BREAKDOWNS = ("length", "depth", "region", "variant")


def condition(rec: dict) -> str:
    """A readable name of the setting a line ran under: 'off' or 'speed S18 T512'."""
    if rec["mode"] == "off":
        return "off"
    return f"{rec['mode']} S{rec.get('split')} T{rec.get('tail')}"


def by_condition(records: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        out[condition(r)].append(r)
    return dict(out)


def accuracy(records: list[dict]) -> dict:
    """{'n', 'correct', 'acc'} overall and per length / depth / region / variant."""
    def acc(rs):
        k = sum(bool(r["correct"]) for r in rs)
        return {"n": len(rs), "correct": k, "acc": k / len(rs) if rs else None}

    return {"overall": acc(records), **_breakdowns(records, acc)}


def _breakdowns(rows: list[dict], summary) -> dict:
    """Per BREAKDOWNS field, `summary` of the rows of each of its values, in the values' order."""
    out = {}
    for field in BREAKDOWNS:
        groups: dict = defaultdict(list)
        for r in rows:
            groups[r[field]].append(r)
        out[field] = {str(k): summary(v) for k, v in sorted(groups.items(), key=lambda kv: kv[0])}
    return out


def compare(a: list[dict], b: list[dict], name_a: str = "A", name_b: str = "B") -> dict:
    """Pair lines by item id. Breakdowns use B's labels (B is the approximated side, whose tail
    decides the region). Items in only one side are counted, not compared."""
    ia = {r["id"]: r for r in a}
    ib = {r["id"]: r for r in b}
    ids = [i for i in ib if i in ia]
    rows = []
    for i in ids:
        rows.append({**{f: ib[i][f] for f in BREAKDOWNS}, "a": bool(ia[i]["correct"]), "b": bool(ib[i]["correct"])})

    def part(rs):
        t = paired_table([r["a"] for r in rs], [r["b"] for r in rs])
        n = t["n"]
        t["acc_a"] = (t["both"] + t["a_only"]) / n if n else None
        t["acc_b"] = (t["both"] + t["b_only"]) / n if n else None
        return t

    return {"a": name_a, "b": name_b, "paired": len(ids), "only_a": len(ia) - len(ids), "only_b": len(ib) - len(ids),
            "overall": part(rows), **_breakdowns(rows, part)}


def recall_records(records: list[dict]) -> list[dict]:
    """Recall lines only (a sweep's file also holds NLL and TTFT lines), one per item and condition:
    the last that may stand (a line from an engine that ignored the mode is replaced by its rerun)."""
    from backend.recall.run import result_key, reusable

    out: dict = {}
    for r in records:
        if r.get("kind", "recall") == "recall":
            key = result_key(r)
            if reusable(r) or key not in out:
                out[key] = r
    return list(out.values())
