"""`python -m lab hitrate`: how often guided mode's selected rows hold the asked needle (no generation).

Example: python -m lab hitrate --lengths 2048,4096,8000 --haystacks corpus,filler,ledger,licences --out h.jsonl
"""
from __future__ import annotations

import json

from app.commands.common import float_list, int_list, open_engine, str_list
from backend.recall.needles import VARIANTS
from lab.commands.common import add_split_tail, eval_items, say, split_tail
from lab.evals.selection import run_hit_rate, summarise


def register(sub) -> None:
    p = sub.add_parser("hitrate", help="guided mode's selection hit rate over needle items (resumable)")
    p.add_argument("--lengths", type=int_list, default=[2048, 4096, 8000])
    p.add_argument("--depths", type=float_list, default=[0.05, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9])
    p.add_argument("--variants", type=str_list, default=list(VARIANTS))
    p.add_argument("--haystacks", type=str_list, default=["corpus", "filler", "ledger", "licences"],
                   help="needle haystacks (corpus, filler, ledger) and licences: questions about real licence texts")
    add_split_tail(p)  # the scoring layers must lie below the split
    p.add_argument("--top", type=int, default=25, help="configurations to print, best first")
    p.add_argument("--out", required=True, help="JSON lines file; an existing one is resumed")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    split, tail = split_tail(args, engine.info)
    items = [it for h in args.haystacks
             for it in eval_items(engine, h, lengths=args.lengths, depths=args.depths, variants=args.variants)]
    items.sort(key=lambda it: (it.length, it.depth, it.variant))  # every haystack early in a long run
    say(f"{len(items)} items on {engine.info.name}; split {split}, tail {tail}; results -> {args.out}")

    def progress(i, n, rec):
        say(f"[{i}/{n}] {rec['id']}: " + ("bulk" if rec.get("bulk") else "not in the bulk, skipped"))

    rows = summarise(run_hit_rate(engine, items, split, tail, args.out, on_item=progress))
    if args.json:
        print(json.dumps([{"config": k, "hits": h, "n": n, "per_haystack": per, "mean_rows": m}
                          for k, h, n, per, m in rows]))
        return 0
    print(f"{'configuration':50} {'hits':>9}  {'rows':>5}  per haystack")
    for k, h, n, per, m in rows[: args.top]:
        print(f"{k:50} {h:>4}/{n:<4}  {m:5.0f}  " + "  ".join(f"{hs} {v}" for hs, v in sorted(per.items())))
    return 0
