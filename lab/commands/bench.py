"""`python -m lab bench --lengths 2048,4096,8000 --split S --tail T`: TTFT of off and speed side by side."""
from __future__ import annotations

import json
import sys

from app.commands.common import open_engine, str_list
from backend.protocol import RIDGEFILL_MODES
from backend.ridgefill.defaults import split_or_default, tail_or_default
from lab.commands.common import ridgefill_mode
from lab.evals.ttft import rows_as_dicts, run_ttft_bench


def register(sub) -> None:
    p = sub.add_parser("bench", help="time to first token, exact vs RidgeFill, on the same prompts in one run")
    p.add_argument("--lengths", default="2048,4096,8000", help="prompt lengths in tokens, comma-separated")
    p.add_argument("--split", type=int, default=None, help="RidgeFill split S (default: the model's)")
    p.add_argument("--tail", type=int, default=None, help="exact tail T (default: the model's)")
    p.add_argument("--mode", default=None, choices=RIDGEFILL_MODES,
                   help="the RidgeFill mode to time (default: the model's)")
    p.add_argument("--settings", type=str_list, default=None,
                   help="several RidgeFill settings against the same exact runs, e.g. guided:6,guided:5,guided:6w "
                        "(w: the bulk's attention below the split windowed); overrides --mode and --split")
    p.add_argument("--repeats", type=int, default=3, help="runs per mode and length (the median is shown)")
    p.add_argument("--half", choices=["choose", "judge"], default=None,
                   help="instead of --lengths: each long-set document of this half at its own length, its first "
                        "question, exact against the app's default request (the guard included)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    if args.half:
        return run_documents(args)
    engine = open_engine(args)
    # Exact is timed at its best: on a sliding-window model, without the full-size window cache that the
    # RidgeFill engine keeps for its re-decodes (docs/measurements/gemma-3.md#guided-on-sliding-window-models).
    exact = open_engine(args, swa_full=False) if engine.pin_seq is not None else engine
    split, tail = split_or_default(engine.info, args.split), tail_or_default(engine.info, args.tail)
    args.mode = ridgefill_mode(engine.info, args.mode, quiet=bool(args.settings))  # --settings name their own
    rows = run_ttft_bench(engine, lengths, split=split, tail=tail, mode=args.mode, repeats=args.repeats,
                          on_progress=lambda msg: print(f"  {msg}", file=sys.stderr), exact_engine=exact,
                          settings=args.settings)
    labels = [name for _ in lengths for name in (args.settings or [args.mode])]
    if args.json:
        print(json.dumps({"model": engine.info.name, "split": split, "tail": tail, "mode": args.mode,
                          "threads": engine.config.n_threads,
                          "results": [{"setting": a, **r} for a, r in zip(labels, rows_as_dicts(rows))]}))
        return 0
    what = ", ".join(args.settings) if args.settings else f"{args.mode} at split {split}"
    print(f"{engine.info.name}: {what}, tail {tail}, {engine.config.n_threads} threads, "
          f"median of {args.repeats}" + ("; exact without the full-size sliding-window cache" if exact is not engine else ""))
    print(f"{'tokens':>7} {'off TTFT':>10} {'exact tok/s':>11} {'setting':>10} {'TTFT':>9} {'ratio':>6}  breakdown / note")
    for label, r in zip(labels, rows):
        detail = ", ".join(f"{k} {v:,.0f}" for k, v in r.breakdown_ms.items() if v) if r.speed_mode_run != "off" else r.note
        print(f"{r.n_prompt:>7,} {r.off_ttft_ms:>8,.0f}ms {r.off_prompt_per_second:>11,.0f} "
              f"{label:>10} {r.speed_ttft_ms:>7,.0f}ms {r.ratio:>5.2f}x  {detail}")
    return 0


def run_documents(args) -> int:
    """`bench --half H`: per document, exact's TTFT and the default's, the ratio, and the mean ratio."""
    from backend.tuning.question_files import long_set
    from lab.evals.ttft import run_document_ttft

    engine = open_engine(args)
    exact = open_engine(args, swa_full=False) if engine.pin_seq is not None else engine
    rows = run_document_ttft(engine, long_set(args.half), repeats=args.repeats, exact_engine=exact,
                             on_progress=lambda msg: print(f"  {msg}", file=sys.stderr))
    ratios = [d.row.ratio for d in rows]
    fell_back = [d.document for d in rows if d.row.speed_mode_run == "off"]
    if args.json:
        print(json.dumps({"model": engine.info.name, "half": args.half, "threads": engine.config.n_threads,
                          "mean_ratio": round(sum(ratios) / len(ratios), 3), "ran_exact": fell_back,
                          "results": [{"document": d.document, **rows_as_dicts([d.row])[0]} for d in rows]}))
        return 0
    print(f"{engine.info.name}, the {args.half} half, {engine.config.n_threads} threads, median of {args.repeats}")
    print(f"{'document':<30} {'tokens':>7} {'exact TTFT':>11} {'mode':>6} {'TTFT':>9} {'ratio':>6}  note")
    for d in rows:
        r = d.row
        print(f"{d.document:<30} {r.n_prompt:>7,} {r.off_ttft_ms:>9,.0f}ms {r.speed_mode_run:>6} "
              f"{r.speed_ttft_ms:>7,.0f}ms {r.ratio:>5.2f}x  {r.note}")
    print(f"mean ratio {sum(ratios) / len(ratios):.2f}x over {len(rows)} documents; ran exact on "
          f"{len(fell_back)}" + (f" ({', '.join(fell_back)})" if fell_back else ""))
    return 0

