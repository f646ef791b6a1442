"""`python -m lab sweep`: per split S, TTFT against exact at one length, bulk-needle accuracy (McNemar
against exact) and ΔNLL with its CI: the speed-quality curve to pick S from. Resumable (--out)."""
from __future__ import annotations

import json

from app.commands.common import float_list, int_list, open_engine, str_list
from backend.recall.needles import build_item, make_items
from backend.recall.report import p_value, pct, table
from backend.ridgefill.defaults import DEFAULT_MODE
from backend.user_paths import data_dir
from lab.commands.common import haystack_of, say, split_tail
from lab.evals.nll import nll_documents
from lab.evals.sweep import run_sweep


def register(sub) -> None:
    p = sub.add_parser("sweep", help="per split: TTFT ratio vs exact, bulk-needle accuracy, ΔNLL")
    p.add_argument("--splits", type=int_list, default=[12, 15, 18, 21, 24], help="splits S, e.g. 12,15,18,21,24")
    p.add_argument("--tail", type=int, default=None, help="exact tail T (default: the model's default)")
    p.add_argument("--ttft-length", type=int, default=4096,
                   help="prompt length for the TTFT ratio (0: use the needle items' own runs, not back to back)")
    p.add_argument("--repeats", type=int, default=1, help="TTFT runs per mode; the fastest counts")
    p.add_argument("--lengths", type=int_list, default=[2048], help="needle item lengths")
    p.add_argument("--depths", type=float_list, default=[0.1, 0.3, 0.5], help="needle depths (bulk ones count)")
    p.add_argument("--variants", type=str_list, default=["single", "multikey"])
    p.add_argument("--reps", type=int, default=1)
    p.add_argument("--haystack", default="filler", help="filler (default), corpus, or a text file")
    p.add_argument("--nll-length", type=int, default=3072, help="document length for ΔNLL (0: skip ΔNLL)")
    p.add_argument("--nll-docs", type=int, default=4, help="documents for ΔNLL")
    p.add_argument("--mode", default=DEFAULT_MODE)
    p.add_argument("--fit", action="store_true", help="fit missing maps first (fit-maps), else such splits run exact")
    p.add_argument("--out", default=None, help="JSON lines file (default: <data dir>/evals/sweep.jsonl); resumed")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    engine = open_engine(args)
    tail = split_tail(args, engine.info)[1]
    out = args.out or str(data_dir() / "evals" / "sweep.jsonl")
    hay = haystack_of(args)
    items = make_items(engine, lengths=args.lengths, depths=args.depths, variants=args.variants, haystack=hay,
                       reps=args.reps)
    in_bulk = sum(it.region(tail) == "bulk" for it in items)
    ttft_item = (build_item(engine, length=args.ttft_length, depth=0.5, variant="single", haystack=hay)
                 if args.ttft_length else None)
    docs = nll_documents(engine, args.nll_length, args.nll_docs) if args.nll_length and args.nll_docs else []
    say(f"sweep of splits {args.splits} on {engine.info.name}, tail {tail}: TTFT at {args.ttft_length or 'item'} tokens, "
        f"{in_bulk} of {len(items)} needle items in the bulk, {len(docs)} NLL documents; results -> {out}")
    last = {}

    def progress(p):
        key = (p.stage, p.split)
        if p.done == p.total or last.get(key, -1) < 0:
            say(f"  S={p.split if p.split is not None else 'off'} {p.stage}: {p.done}/{p.total}")
        last[key] = p.done

    result = run_sweep(engine, splits=args.splits, tail=tail, ttft_item=ttft_item, items=items, docs=docs,
                       out_path=out, mode=args.mode, fit=args.fit, repeats=args.repeats, on_progress=progress)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(sweep_text(result))
    return 0


def sweep_text(r: dict) -> str:
    rows = []
    for x in r["rows"]:
        dn = "-" if x["dnll"] is None else f"{x['dnll']:+.4f} [{x['dnll_lo']:+.4f}, {x['dnll_hi']:+.4f}]"
        rows.append([x["split"], x["mode_run"], f"{x['ttft_off_ms'] / 1000:.1f}", f"{x['ttft_ms'] / 1000:.1f}",
                     f"{x['ttft_ratio']:.2f}x" if x["ttft_ratio"] else "-",
                     f"{x['bulk_correct']}/{x['bulk_items']}", pct(x["bulk_acc"]), pct(x["off_bulk_acc"]),
                     p_value(x["p_mcnemar"]), dn])
    head = (f"{r['model']}: {r['mode']} vs off, tail {r['tail']}, " + (
        f"TTFT at {r['length']} tokens (exact and {r['mode']} back to back per split)" if r["ttft_paired"]
        else "TTFT: mean over the needle items' runs (exact and RidgeFill not back to back)"))
    notes = sorted({f"S={x['split']}: {x['note']}" for x in r["rows"] if x.get("note")})
    return "\n".join([head, table(["S", "ran", "TTFT off s", f"TTFT {r['mode']} s", "speed-up", "bulk needles",
                                   f"{r['mode']} acc", "off acc", "McNemar p", "ΔNLL [95% CI]"], rows)] + notes)
