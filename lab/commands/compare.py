"""`python -m lab compare A.jsonl [B.jsonl]`: accuracy breakdowns and the paired test of two recall runs.

One file: every condition in it against `off`. Two files: A's condition against B's, paired by item id
(`--a` / `--b` pick a condition such as "off" or "speed S18 T512" when a file holds several).
"""
from __future__ import annotations

import json
from pathlib import Path

from backend.errors import RidgeFillError
from backend.recall.run import load_results
from lab.evals.compare import accuracy, by_condition, compare, recall_records
from lab.evals.report import accuracy_table, comparison_text


class CompareError(RidgeFillError):
    pass


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare recall results: accuracy per length/depth/region/variant, McNemar")
    p.add_argument("files", nargs="+", metavar="FILE.jsonl", help="one or two results files from `recall`")
    p.add_argument("--a", default=None, help="condition to take from the first file (e.g. off)")
    p.add_argument("--b", default=None, help="condition to take from the second file (e.g. 'speed S18 T512')")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _read(path: str) -> dict[str, list[dict]]:
    if not Path(path).is_file():
        raise CompareError(f"{path} does not exist; give a results file written by `python -m lab recall --out`.")
    conds = by_condition(recall_records(load_results(path)))
    if not conds:
        raise CompareError(f"{path} holds no recall results.")
    return conds


def _pick(conds: dict, wanted: str | None, prefer_off: bool, path: str) -> str:
    if wanted is not None:
        if wanted not in conds:
            raise CompareError(f"{path} has no condition {wanted!r}; it has: {', '.join(conds)}")
        return wanted
    if prefer_off and "off" in conds:
        return "off"
    rest = [c for c in conds if c != "off"] or list(conds)
    if len(rest) != 1:
        raise CompareError(f"{path} holds several conditions ({', '.join(conds)}); pick one with --a/--b")
    return rest[0]


def run(args) -> int:
    if len(args.files) > 2:
        raise CompareError("compare takes one or two files")
    if len(args.files) == 1:
        conds = _read(args.files[0])
        acc = {c: accuracy(rs) for c, rs in conds.items()}
        a = _pick(conds, args.a, True, args.files[0])
        cmps = [compare(conds[a], rs, a, c) for c, rs in conds.items() if c != a]
    else:
        ca, cb = _read(args.files[0]), _read(args.files[1])
        a = _pick(ca, args.a, True, args.files[0])
        b = _pick(cb, args.b, False, args.files[1])
        name_a, name_b = f"{a} ({Path(args.files[0]).name})", f"{b} ({Path(args.files[1]).name})"
        acc = {name_a: accuracy(ca[a]), name_b: accuracy(cb[b])}
        cmps = [compare(ca[a], cb[b], name_a, name_b)]
    if args.json:
        print(json.dumps({"accuracy": acc, "comparisons": cmps}, indent=1))
        return 0
    print(accuracy_table(acc))
    for c in cmps:
        print()
        print(comparison_text(c))
    return 0
