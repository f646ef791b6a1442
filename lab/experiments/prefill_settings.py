"""The prefill as fast as llama.cpp allows on this CPU: exact with flash attention on and off and guided
at one split, each at several micro-batch sizes, on one prompt of N tokens, one run each, side by side
(run it alone on the machine).

    .venv/bin/python -m lab.experiments.prefill_settings GEMMA.gguf 16384 --ubatch 256,512,1024 --split 5
"""
from __future__ import annotations

import argparse
import json

from app.commands.common import int_list, str_list
from backend.completion import complete
from backend.engine import Engine, EngineConfig
from backend.protocol import CompletionRequest
from backend.recall.haystacks import corpus_haystack
from backend.recall.needles import build_item
from backend.ridgefill.defaults import tail_or_default
from backend.ridgefill.runtime import warm_up


def engine_for(model: str, n_ctx: int, threads: int, ubatch: int, *, flash: bool = True, swa_full: bool = False):
    return Engine(EngineConfig(model_path=model, n_ctx=n_ctx, n_threads=threads, n_batch=ubatch, n_ubatch=ubatch,
                               flash_attn=flash, swa_full=swa_full))


def timed(engine, request) -> tuple[float, dict]:
    """Seconds to the first token, and where a RidgeFill prefill spent them (ms per phase)."""
    request.max_tokens, request.reuse_prefix = 1, False
    timings = complete(engine, request).timings
    return timings.ttft_ms / 1000, timings.breakdown_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("length", type=int)
    ap.add_argument("--ubatch", type=int_list, default=[256, 512, 1024])
    ap.add_argument("--split", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=str_list, default=["exact", "noflash", "guided"],
                    help="which to time: exact (flash attention on), noflash, guided")
    args = ap.parse_args()
    n_ctx = args.length + 256
    probe = engine_for(args.model, n_ctx, args.threads, 512)
    item = build_item(probe, length=args.length, depth=0.5, haystack=corpus_haystack())
    tokens = probe.prompt_tokens(item.request("off"))
    tail = tail_or_default(probe.info, None)
    probe.close()
    rows = []

    def record(what: str, ubatch: int, seconds_and_phases: tuple[float, dict]) -> None:
        seconds, phases = seconds_and_phases
        rows.append({"what": what, "ubatch": ubatch, "seconds": round(seconds, 2), "phases_ms": phases})
        print(json.dumps(rows[-1]), flush=True)

    for ub in args.ubatch:
        for flash in [f for f, name in ((True, "exact"), (False, "noflash")) if name in args.runs]:
            with engine_for(args.model, n_ctx, args.threads, ub, flash=flash) as e:
                timed(e, CompletionRequest(prompt="Hello"))  # the first decode's one-off set-up
                record(f"exact, flash {'on' if flash else 'off'}", ub, timed(e, item.request("off")))
        if "guided" in args.runs:
            with engine_for(args.model, n_ctx, args.threads, ub, swa_full=True) as e:
                warm_up(e, args.split)
                timed(e, CompletionRequest(prompt="Hello"))  # the first decode's one-off set-up
                record(f"guided:{args.split}", ub, timed(e, item.request("guided", args.split, tail)))
    print(f"{len(tokens)} tokens, {args.threads} threads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
