"""`python -m app tune [--json] [--budget-s N] [--splits ...]`: choose this model's split by measurement.

Fits maps for a few candidate splits from one capture (Get maps), runs a short bulk-needle check (exact
against RidgeFill in the model's default mode, items from the shipped corpus), a fixed subset of the real
questions (realqa) and a TTFT ratio at one length, and records the lowest split that keeps recall on both
beside the maps; the model's default split is then that one (backend/ridgefill/defaults.py). The rule and
the figures: backend/tuning/tune.py.
"""
from __future__ import annotations

import json
import sys

from app.commands.common import float_list, int_list, open_engine, say_note, stage_printer, str_list


def register(sub) -> None:
    from backend.tuning import tune

    p = sub.add_parser("tune", help="choose the model's split by measurement (recall vs exact, TTFT ratio) and record it")
    p.add_argument("--splits", type=int_list, default=None,
                   help="candidate splits, e.g. 9,12,15,18 (default: 30/40/50/60%% of the layers and the default split)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="measuring time budget in seconds: candidates that would pass it are not started "
                        f"(default {tune.DEFAULT_BUDGET_S:.0f}, {tune.LONG_BUDGET_S:.0f} with long items; a first "
                        "capture comes on top)")
    p.add_argument("--length", type=int, default=tune.DEFAULT_LENGTH, help="needle item length in tokens")
    p.add_argument("--long-length", type=int, default=None,
                   help=f"length of the long items (default {tune.LONG_LENGTH} on a model trained on "
                        f"{tune.LONG_CONTEXT:,}+ tokens; 0: none)")
    p.add_argument("--ttft-length", type=int, default=None,
                   help=f"prompt length of the TTFT ratio (default: the long items', else {tune.DEFAULT_TTFT_LENGTH})")
    p.add_argument("--depths", type=float_list, default=list(tune.DEFAULT_DEPTHS), help="needle depths")
    p.add_argument("--variants", type=str_list, default=list(tune.DEFAULT_VARIANTS), help="needle variants")
    p.add_argument("--haystacks", type=str_list, default=list(tune.DEFAULT_HAYSTACKS),
                   help="needle haystacks: corpus, filler, ledger (default corpus,filler)")
    p.add_argument("--questions-per-part", type=int, default=tune.REAL_PER_PART,
                   help="real questions (realqa) asked of each of its 16 document parts, spread over the part "
                        f"(default {tune.REAL_PER_PART}; 0: needles only)")
    p.add_argument("--mode", default=None, help="RidgeFill mode to tune (default: the model's default mode)")
    p.add_argument("--tail", type=int, default=None, help="exact tail T (default: the model's default)")
    p.add_argument("--capture-tokens", type=int, default=None,
                   help="when the model has no captured activations yet: capture at most this many tokens")
    p.add_argument("--no-record", action="store_true", help="measure only; do not change the model's default split")
    p.add_argument("--json", action="store_true",
                   help='print {"model","split","tail","mode","candidates":[{"split","bulk_correct","exact_correct","n",'
                        '"lost","ratio","real_questions":{"n","exact_correct","correct","lost","gained","keeps"}}]}')
    p.set_defaults(func=run)


def run(args) -> int:
    from backend.tuning.tune import run_tune
    from backend.hub.get_maps import CaptureOptions

    if args.budget_s is not None and args.budget_s <= 0:
        print("error: --budget-s must be positive", file=sys.stderr)
        return 2
    if args.questions_per_part < 0:
        print("error: --questions-per-part must be 0 (needles only) or more", file=sys.stderr)
        return 2
    engine = open_engine(args)
    try:
        result = run_tune(engine, splits=args.splits, budget_s=args.budget_s, length=args.length,
                          long=args.long_length, ttft_length=args.ttft_length, depths=args.depths, variants=args.variants,
                          haystacks=args.haystacks, real_per_part=args.questions_per_part, mode=args.mode,
                          tail=args.tail, capture=CaptureOptions(max_tokens=args.capture_tokens),
                          record=not args.no_record, on_progress=stage_printer(), on_note=say_note)
    finally:
        engine.close()
    if args.json:
        print(json.dumps(result.brief()))
        return 0
    print(tune_text(result))
    return 0


def tune_text(r) -> str:
    from backend.recall.report import table
    from backend.ridgefill.tuned import summary

    rows = [[c.split, f"{c.bulk_correct}/{c.n}", f"{c.exact_correct}/{c.n}", _real_cell(c.real),
             f"{c.ratio:.2f}x" if c.ratio else "-", "yes" if c.keeps else "no", c.maps, c.refused] for c in r.candidates]
    at = f"{r.length} and {r.long_length}" if r.long_length else f"{r.length}"
    real = f", {r.real.n} real questions (exact right {r.real.exact_correct})" if r.real and r.real.n else ""
    lines = [f"{r.model}: mode {r.mode}, tail {r.tail}, {r.n} bulk-needle items at {at} tokens{real}, "
             f"TTFT ratio at {r.ttft_length} tokens, {r.seconds:.0f} s",
             table(["S", "RidgeFill", "exact", "real questions", "TTFT ratio", "keeps recall", "maps", "refused"], rows)]
    if r.real_left_out:
        lines.append(f"real questions left out (their prompts do not fit): {', '.join(r.real_left_out)}")
    if r.skipped:
        lines.append(f"not measured: splits {r.skipped}")
    lines.append(f"chosen: S = {r.split} ({r.chosen_by})")
    rec = {"split": r.split, "ttft_length": r.ttft_length, "chosen_by": r.chosen_by,
           "candidates": [{**c.brief(), "keeps": c.keeps} for c in r.candidates]}
    lines.append(summary(rec))
    if r.record_path:
        lines.append(f"recorded: {r.record_path} (the model's default split from now on)")
    return "\n".join(lines)


def _real_cell(real) -> str:
    """A candidate's real questions: "5/32, lost 2 of 7, gained 0"; "-" when not run at this split."""
    if real is None or real.correct is None:
        return "-"
    return f"{real.correct}/{real.n}, lost {real.lost} of {real.exact_correct}, gained {real.gained}"
