"""`python -m lab followup`: a second question about another fact in the same chat, exact vs RidgeFill.

Example: python -m lab followup --lengths 4096 --depths 0.2,0.5 --haystack corpus --out f.jsonl
"""
from __future__ import annotations

import json
from pathlib import Path

from app.commands.common import float_list, int_list, open_engine
from backend.recall.needles import make_items
from backend.recall.stats import mcnemar_exact

from lab.commands.common import add_split_tail, haystack_of, ridgefill_mode, say, split_tail
from lab.evals.followup import run_followup


def register(sub) -> None:
    p = sub.add_parser("followup", help="follow-up question TTFT and recall, exact vs RidgeFill (resumable)")
    p.add_argument("--lengths", type=int_list, default=[4096])
    p.add_argument("--depths", type=float_list, default=[0.1, 0.3, 0.5, 0.7])
    p.add_argument("--haystack", default="corpus", help="filler, corpus (default), ledger, or a text file")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--mode", default=None, help="the RidgeFill mode (default: the model's)")
    add_split_tail(p)
    p.add_argument("--out", required=True, help="JSON lines file; an existing one is resumed")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    split, tail = split_tail(args, engine.info)
    args.mode = ridgefill_mode(engine.info, args.mode)
    items = make_items(engine, lengths=args.lengths, depths=args.depths, variants=["multikey"],
                       haystack=haystack_of(args), reps=args.reps)
    out = Path(args.out)
    done = {(r["id"], r["mode"]): r for r in map(json.loads, out.read_text().splitlines())} if out.exists() else {}
    for item in items:
        for mode in ("off", args.mode):
            if (item.id, mode) in done:
                continue
            rec = run_followup(engine, item, mode, split if mode != "off" else None, tail)
            if rec is None:
                break
            done[(item.id, mode)] = rec
            with out.open("a") as f:
                f.write(json.dumps(rec) + "\n")
            say(f"{item.id} {mode}: follow-up {'correct' if rec['follow_correct'] else 'wrong'}, "
                f"TTFT {rec['follow_ttft_ms']:,.0f} ms ({rec['follow_cache_n']} cached, {rec['follow_exact_n']} made exact)")
    pairs = [(done[(i.id, "off")], done[(i.id, args.mode)]) for i in items
             if (i.id, "off") in done and (i.id, args.mode) in done]
    if not pairs:
        print("no item had its follow-up's needle in the bulk")
        return 0
    n = len(pairs)
    off_ok = sum(a["follow_correct"] for a, _ in pairs)
    rf_ok = sum(b["follow_correct"] for _, b in pairs)
    b = sum(a["follow_correct"] and not c["follow_correct"] for a, c in pairs)
    c = sum(c["follow_correct"] and not a["follow_correct"] for a, c in pairs)
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    t_off = med([a["follow_ttft_ms"] for a, _ in pairs])
    t_rf = med([b["follow_ttft_ms"] for _, b in pairs])
    print(f"follow-up questions, n = {n}: exact {off_ok}/{n}, {args.mode} S={split} T={tail} {rf_ok}/{n} "
          f"(McNemar p = {mcnemar_exact(b, c):.3f}); median follow-up TTFT exact {t_off:,.0f} ms, "
          f"{args.mode} {t_rf:,.0f} ms")
    return 0
