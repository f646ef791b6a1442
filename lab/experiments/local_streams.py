"""The streams entering late layers computed block by block, each block seeing only the rows just before it
(and the document's first token): late_inputs_exact.py --local feeds them to the bulk's late K/V; run as
a command, it times that pass beside exact and guided on one prompt (one run each; alone on the machine).

    .venv/bin/python -m lab.experiments.local_streams GEMMA.gguf 16384 --block 2048 --before 512 --to 11
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from backend.protocol import CompletionRequest
from backend.recall.haystacks import corpus_haystack
from backend.recall.needles import build_item
from backend.ridgefill.defaults import tail_or_default
from backend.ridgefill.runtime import warm_up
from backend.ridgefill.stream_capture import capture_streams
from lab.experiments.prefill_settings import engine_for, timed


def local_streams(engine, tokens: list[int], layers: list[int], block: int, before: int) -> dict[int, np.ndarray]:
    """The streams entering `layers` for every row, each block of `block` rows captured as its own sequence:
    the document's first token, the `before` rows ahead of the block, the block. The sequence starts at
    position 0: RoPE scores depend on the rows' distances only, so the streams are those of the rows at
    their own positions with everything further back (but the first token) out of sight."""
    parts: dict[int, list[np.ndarray]] = {il: [] for il in layers}
    for start in range(0, len(tokens), block):
        ahead = tokens[max(1, start - before) : start]
        seq = tokens[:1] + ahead + tokens[max(1, start) : start + block]
        got = capture_streams(engine, [seq], layers, dtype=np.float32)
        skip = len(seq) - len(tokens[start : start + block])
        for il in layers:
            parts[il].append(got[il][skip:])
    return {il: np.concatenate(p) for il, p in parts.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("length", type=int)
    ap.add_argument("--block", type=int, default=2048)
    ap.add_argument("--before", type=int, default=512)
    ap.add_argument("--to", type=int, default=11, help="the layer whose input is wanted (layers below it run)")
    ap.add_argument("--split", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    n_ctx = args.length + 256
    with engine_for(args.model, n_ctx, args.threads, 512) as e:  # exact as the app runs it
        item = build_item(e, length=args.length, depth=0.5, haystack=corpus_haystack())
        tokens = e.prompt_tokens(item.request("off"))
        timed(e, CompletionRequest(prompt="Hello"))  # the first decode's one-off set-up
        exact_s, _ = timed(e, item.request("off"))
    with engine_for(args.model, n_ctx, args.threads, 512, swa_full=True) as e:  # guided as the app runs it
        warm_up(e, args.split)
        timed(e, CompletionRequest(prompt="Hello"))
        guided_s, phases = timed(e, item.request("guided", args.split, tail_or_default(e.info, None)))
        t0 = time.perf_counter()
        local_streams(e, tokens, [args.to], args.block, args.before)
        local_s = time.perf_counter() - t0
    print(json.dumps({"tokens": len(tokens), "exact_s": round(exact_s, 2), "guided_s": round(guided_s, 2),
                      "guided_phases_ms": phases, f"local_to_{args.to}_s": round(local_s, 2),
                      "exact / (guided + local)": round(exact_s / (guided_s + local_s), 2)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
