"""`python -m app tune [--json] [--budget-s N] [--splits ...]`: choose this model's setting by fidelity.

Fits maps for a few candidate splits from one capture (Get maps), has exact, llama.cpp's q8_0 K/V cache and
each setting (speed, then guided, lowest split first) answer questions about the long set's judge-half
documents, and records the fastest setting whose replies stay within 2× q8_0's distance from exact's on
every document (none: exact), with a needle check beside it; the model's default split and mode are then
that one (backend/ridgefill/defaults.py). The rule and the figures: backend/tuning/tune.py.
"""
from __future__ import annotations

import json
import sys

from app.commands.common import int_list, open_engine, say_note, stage_printer, str_list
from backend.json_file import finite


def register(sub) -> None:
    from backend.tuning import documents, tune

    p = sub.add_parser("tune", help="choose the model's split and mode by fidelity to exact (beside q8_0's cache) and record it")
    p.add_argument("--splits", type=int_list, default=None,
                   help="candidate splits, e.g. 9,12,15,18 (default: 30/40/60/70/80%% of the layers and the default split)")
    p.add_argument("--modes", type=str_list, default=None, help="modes tried at each split (default speed,guided)")
    p.add_argument("--budget-s", type=float, default=None,
                   help=f"measuring time budget in seconds: settings that would pass it are not started (default "
                        f"{tune.DEFAULT_BUDGET_S:.0f}; exact and q8_0 always run; a first capture comes on top)")
    p.add_argument("--doc-tokens", type=int, default=None,
                   help=f"each judge-half document cut to this many tokens (default: {documents.DOC_TOKENS:,}, shorter "
                        "on a slower engine, so that the tune keeps to its budget; the model's context bounds it)")
    p.add_argument("--questions-per-document", type=int, default=documents.PER_DOC, help="questions asked of each document")
    p.add_argument("--tail", type=int, default=None, help="exact tail T (default: the model's default)")
    p.add_argument("--no-needles", action="store_true", help="skip the needle check beside the choice")
    p.add_argument("--capture-tokens", type=int, default=None,
                   help="when the model has no captured activations yet: capture at most this many tokens")
    p.add_argument("--no-record", action="store_true", help="measure only; do not change the model's defaults")
    p.add_argument("--json", action="store_true",
                   help='print {"model","split","tail","mode","chosen_by","candidates":[{"setting","keeps","ratio",'
                        '"worst_document","worst_ratio","documents"}],"skipped","needles"}')
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.tuning.tune import run_tune
    from backend.hub.get_maps import CaptureOptions

    if args.budget_s is not None and args.budget_s <= 0:
        print("error: --budget-s must be positive", file=sys.stderr)
        return 2
    if args.questions_per_document < 1 or (args.doc_tokens is not None and args.doc_tokens < 1):
        print("error: --questions-per-document and --doc-tokens must be at least 1", file=sys.stderr)
        return 2
    engine = open_engine(args)
    try:
        result = run_tune(engine, splits=args.splits, modes=args.modes, budget_s=args.budget_s,
                          doc_tokens=args.doc_tokens, per_doc=args.questions_per_document, tail=args.tail,
                          needles=not args.no_needles, capture=CaptureOptions(max_tokens=args.capture_tokens),
                          record=not args.no_record, on_progress=stage_printer(), on_note=say_note)
    finally:
        engine.close()
    if args.json:
        print(json.dumps(finite(result.brief()), allow_nan=False))
        return 0
    print(tune_text(result))
    return 0


def tune_text(r) -> str:
    from backend.recall.report import table
    from backend.ridgefill.tuned import summary

    rows = [[c.setting, len(c.documents), _worst_cell(c), f"{c.ratio:.2f}x" if c.ratio else "-",
             "yes" if c.keeps else "no", c.maps, c.refused] for c in r.candidates]
    lines = [f"{r.model}: tail {r.tail}, {len(r.documents)} judge-half documents (at most {r.doc_tokens:,} tokens), "
             f"{r.questions} questions, {r.seconds:.0f} s",
             table(["setting", "documents", "worst document (vs q8_0)", "speed", "keeps replies", "maps", "refused"], rows)]
    if r.left_out:
        lines.append("left out: " + "; ".join(f"{d}: {why}" for d, why in r.left_out.items()))
    if r.skipped:
        lines.append(f"not measured (budget): {', '.join(r.skipped)}")
    if r.needles:
        n = r.needles
        lines.append(f"needle check: {n['skipped']}" if "skipped" in n else
                     f"needle check: {n['correct']}/{n['n']} (exact {n['exact_correct']}/{n['n']}, {n['lost']} lost)")
    lines.append(f"chosen: {r.chosen_by}")
    lines.append(summary(r.record()))
    if r.record_path:
        lines.append(f"recorded: {r.record_path} (the model's default from now on)")
    return "\n".join(lines)


def _worst_cell(c) -> str:
    w = c.worst
    return f"{w['document']} {w['ratio']:.1f}x (dnll {w['dnll']:+.3f})" if w else "-"
