"""`python -m lab sources`: how often the answer's top source, and any of its 3, holds the asked fact's sentence.

Example: python -m lab sources --lengths 2048 --depths 0.1,0.5,0.9 --haystacks filler,ledger,realqa --out s.jsonl
"""
from __future__ import annotations

import json
from itertools import zip_longest

from app.commands.common import float_list, int_list, open_engine, str_list
from backend.recall.report import table
from backend.ridgefill.defaults import DEFAULT_MODE
from backend.ridgefill.runtime import warm_up
from lab.commands.common import add_split_tail, eval_items, say, split_tail
from lab.evals.sources import precision_table, run_sources


def register(sub) -> None:
    p = sub.add_parser("sources", help="sources precision per length, depth, haystack and mode (resumable)")
    p.add_argument("--lengths", type=int_list, default=[2048], help="needle prompt lengths in tokens")
    p.add_argument("--depths", type=float_list, default=[0.05, 0.35, 0.65, 0.9], help="needle depths (0..1)")
    p.add_argument("--variants", type=str_list, default=["single"], help="needle variants, e.g. single,multikey")
    p.add_argument("--haystacks", type=str_list, default=["corpus", "filler", "ledger"],
                   help="needle haystacks (corpus = prose, filler, ledger = number-dense) and realqa or licences "
                        "(questions about real documents)")
    p.add_argument("--reps", type=int, default=1, help="needle items per length/depth/variant")
    p.add_argument("--limit", type=int, default=None,
                   help="at most this many items per haystack, evenly spread (a question set has 191)")
    add_split_tail(p)
    p.add_argument("--modes", type=str_list, default=["off", DEFAULT_MODE])
    p.add_argument("--out", required=True, help="JSON lines file; an existing one is resumed")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def spread(items: list, limit: int | None) -> list:
    """At most `limit` of `items`, evenly spaced (all of them without a limit)."""
    if limit is None or limit >= len(items):
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def run(args) -> int:
    engine = open_engine(args)
    split, tail = split_tail(args, engine.info)
    per_haystack = [spread(eval_items(engine, h, lengths=args.lengths, depths=args.depths, variants=args.variants,
                                      reps=args.reps), args.limit) for h in args.haystacks]
    # haystacks taken in turn, so a run stopped early has some of each
    items = [it for group in zip_longest(*per_haystack) for it in group if it is not None]
    warm_up(engine, split)  # RidgeFill's one-time set-up (layout, weights, maps) stays out of the timings
    say(f"{len(items)} items x {len(args.modes)} modes on {engine.info.name}; split {split}, tail {tail}; "
        f"results -> {args.out}")

    def progress(i, n, rec):
        if rec is not None:
            say(f"[{i}/{n}] {rec['id']} {rec['mode']}: top {'yes' if rec['top'] else 'no'}, any of 3 "
                f"{'yes' if rec['any'] else 'no'} ({rec['sources_ms']:.0f} ms of sources, TTFT {rec['ttft_ms']:.0f} ms)"
                + (f"  [{rec['note']}]" if rec.get("note") else ""))

    rows = precision_table(run_sources(engine, items, args.modes, split, tail, args.out, on_record=progress))
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(table(["mode", "group", "n", "top", "any of 3", "top (no contrast)", "any (no contrast)", "sources ms",
                 "TTFT ms"],
                [[r["mode"], r["group"], r["n"], _share(r["top"], r["n"]), _share(r["any"], r["n"]),
                  _share(r["top_plain"], r["n"]), _share(r["any_plain"], r["n"]), r["sources_ms"],
                  "restored" if r["ttft_ms"] is None else r["ttft_ms"]]
                 for r in rows]))
    return 0


def _share(k: int, n: int) -> str:
    return f"{k}/{n} {100 * k / n:.0f}%"
