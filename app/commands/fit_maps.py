"""`python -m app fit-maps [--split S] [--all-splits]`: fit RidgeFill maps into the user cache.

The first run captures calibration activations (the shipped corpus and chat copies, a few minutes;
an interrupted capture resumes); later runs refit any split from that cache in seconds. It goes through
the same Get maps path as the GUI (backend/hub/get_maps.py), told to fit. Progress (with the time left)
goes to stderr, the result to stdout.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from app.commands.common import model_path


def register(sub) -> None:
    p = sub.add_parser("fit-maps", help="fit RidgeFill maps for a split (captures calibration activations once)")
    p.add_argument("--split", type=int, default=None, help="split S (default: the model's default split)")
    p.add_argument("--all-splits", action="store_true", help="fit every split 1..L-2")
    p.add_argument("--stride", type=int, default=None, help="keep every N-th row when capturing (default 4)")
    p.add_argument("--seq-tokens", type=int, default=None,
                   help="cut each calibration text to this many tokens when capturing (default 1024)")
    p.add_argument("--capture-tokens", type=int, default=None,
                   help="capture at most this many calibration tokens (default: the whole corpus, ~28K)")
    p.add_argument("--recapture", action="store_true", help="capture the calibration activations again")
    p.add_argument("--int8", action="store_true", help="store int8 maps (per-128-column scales), half the size")
    p.add_argument("--out", default=None, help="folder for the map set (default: the user cache's maps/)")
    p.add_argument("--json", action="store_true", help="print one JSON object per map set")
    p.set_defaults(func=run)


def run(args) -> int:
    from app.commands.common import say_note, stage_printer
    from backend.hub.get_maps import CaptureOptions, get_maps
    from backend.model_file import read_model_info
    from backend.ridgefill.calibration import current_activations
    from backend.ridgefill.defaults import split_or_default
    from backend.ridgefill.maps import load_maps

    path = model_path(args)
    info = read_model_info(path)
    if args.all_splits:
        splits = list(range(1, info.n_layer - 1))
    else:
        splits = [split_or_default(info, args.split)]
    bad = [s for s in splits if not 1 <= s <= info.n_layer - 2]
    if bad:
        print(f"error: a split must lie in 1..{info.n_layer - 2} for this {info.n_layer}-layer model, not {bad[0]}",
              file=sys.stderr)
        return 2
    if (args.stride or args.seq_tokens or args.capture_tokens) and not args.recapture \
            and current_activations(path) is not None:
        print("note: activations are cached; --stride/--seq-tokens/--capture-tokens apply with --recapture",
              file=sys.stderr)
    capture = CaptureOptions(max_tokens=args.capture_tokens, seq_tokens=args.seq_tokens, stride=args.stride,
                             recapture=args.recapture, threads=args.threads)
    progress = stage_printer()
    for i, split in enumerate(splits):
        t0 = time.perf_counter()
        # The one Get maps path, told to fit (never download) and to refit a set that exists.
        res = get_maps(path, split, download=False, refit=True, out_dir=args.out,
                       map_dtype="int8" if args.int8 else "float16",
                       capture=capture if i == 0 else CaptureOptions(), on_progress=progress, on_note=say_note)
        refit_s = time.perf_counter() - t0
        maps = load_maps(res.folder, path)  # what was written must verify
        _report(maps, Path(res.folder), refit_s, args.json)
    return 0


def _report(maps, folder: Path, refit_s: float, as_json: bool) -> None:
    m = maps.manifest
    cal = m["calibration"]
    if as_json:
        print(json.dumps({
            "folder": str(folder), "split": maps.split, "layers": maps.layers, "map_dtype": m["map_dtype"],
            "heldout_cosine": m["heldout_cosine"], "lambda": m["lambda"], "refit_seconds": round(refit_s, 2),
            "calibration": {k: v for k, v in cal.items() if k != "corpus"}, "warnings": maps.warnings,
        }))
        return
    print(f"maps      {folder}")
    print(f"split     {maps.split} (layers {maps.layers[0]}..{maps.layers[-1]}), {m['map_dtype']}")
    print(f"calib     {cal['tokens']:,} tokens ({cal['prose_sequences']} prose + {cal['chat_sequences']} chat "
          f"sequences, {cal['documents']} documents), stride {cal['stride']} -> {cal['rows']:,} rows, "
          f"captured in {cal['capture_seconds']:,.0f} s")
    print(f"refit     {refit_s:.1f} s from cached activations (fit alone {cal['fit_seconds']:.1f} s, "
          f"{cal.get('fit_cpu_seconds', 0):.1f} s CPU)")
    print("layer  held-out cos  alpha    lambda")
    for l in maps.layers:
        print(f"{l:>5}  {m['heldout_cosine'][str(l)]:>12.4f}  {m['lambda'][str(l)]:<7g}  "
              f"{cal['lambda_abs'][str(l)]:.4g}")
    for w in maps.warnings:
        print(f"warning   {w}")
