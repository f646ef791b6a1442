"""`python -m lab cache bench`: the prompt cache's figures, all from one run (timed: run it on an idle machine).

A document of about --tokens tokens from the shipped corpus is asked about:
  cold        a new process, no cache: exact prefill, TTFT of question 1 and of question 2
  saved       this process: the document prefilled in --mode, saved (its bytes per 1,000 tokens)
  refined     its approximated rows made exact while idle: the time against the exact prefill's (the
              new process's, and this process's just before), how
              long a task arriving mid-chunk waits for it to stop (PREEMPTIONS arrivals at random
              moments; their stopped chunks are left out of the time), the next-token KL against exact
  reopened    a new process with the cache: TTFT of question 2 and its cache_n
Prints a table, or JSON with --json. Everything is written under a temporary folder, not the user cache.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

QUESTIONS = ("What is the first story about?", "Who is named in the last paragraph?")
PREEMPTIONS = 3  # tasks "arriving" during the refinement, each at a random moment of a chunk


def register(sub) -> None:
    """`cache bench`, as the app had it beside `cache list` and `cache clear` (app/commands/cache.py)."""
    cache = sub.add_parser("cache", help="the prompt cache's figures: `cache bench`")
    actions = cache.add_subparsers(dest="cache_action", metavar="ACTION", required=True)
    p = actions.add_parser("bench", help="TTFT after reopening, refinement time, bytes per 1,000 tokens (timed)")
    p.add_argument("--tokens", type=int, default=6000, help="document length in tokens")
    p.add_argument("--mode", default="guided", help="how the document is prefilled before refinement")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def _document(engine, n_tokens: int) -> str:
    from backend.corpus import corpus_texts

    text = ""
    for t in corpus_texts() * 8:
        if len(engine.tokenize(text, add_special=False)) >= n_tokens:
            break
        text += t + "\n\n"
    toks = engine.tokenize(text, add_special=False)[:n_tokens]
    return engine.detokenize(toks)


def _chat(args, doc: Path, question: str, cache_dir: Path, *extra: str) -> dict:
    """`chat --json` in a new process (a reopened app): its timings."""
    cmd = [sys.executable, "-m", "app", "--ctx", str(args.ctx), "chat", "--doc", str(doc), question, "--json",
           "--max-tokens", "1", "--mode", "off", *extra]  # the reference: the exact prefill
    if args.model:
        cmd[3:3] = ["--model", args.model]
    if args.threads:
        cmd[3:3] = ["--threads", str(args.threads)]
    env = {**os.environ, "RIDGEFILL_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["timings"]


def run(args) -> int:
    from app.commands.common import open_engine
    from backend.completion import complete
    from backend.documents import document_messages
    from backend.idle_work import IdleWork
    from backend.prompt_cache import PromptCache
    from backend.protocol import CompletionRequest
    from backend.ridgefill.refine import Refinement
    from backend.ridgefill.runtime import warm_up

    engine = open_engine(args)
    work_dir = Path(tempfile.mkdtemp(prefix="ridgefill-cache-bench-"))
    doc = work_dir / "document.txt"
    doc.write_text(_document(engine, args.tokens), encoding="utf-8")
    cache_dir = work_dir / "cache"
    out: dict = {"model": engine.info.name, "tokens": args.tokens, "mode": args.mode}
    cold = [_chat(args, doc, q, cache_dir, "--no-cache") for q in QUESTIONS]
    out["cold_ttft_ms"] = [round(t["ttft_ms"]) for t in cold]
    out["exact_prompt_ms"] = round(cold[0]["prompt_ms"])

    warm_up(engine)
    cache = PromptCache(cache_dir / "prompts")
    messages = document_messages(doc.read_text(encoding="utf-8"), QUESTIONS[0])
    # the exact prefill again in this process, just before the refinement: a share that a new
    # process's start and the machine's drift between the two do not move
    here = complete(engine, CompletionRequest(messages=messages, max_tokens=1, mode="off"))
    out["exact_prompt_ms_here"] = round(here.timings.prompt_ms)
    engine.slot.truncate(0)
    first = complete(engine, CompletionRequest(messages=messages, max_tokens=1, mode=args.mode), prompt_cache=cache)
    out["saved_mode_ran"], out["saved_prompt_ms"] = first.timings.mode, round(first.timings.prompt_ms)
    work = IdleWork(engine, cache, refine=False)
    work.after_completion()
    work.run()
    _entry_size(out, cache, engine)  # none on a sliding-window model: saved once exact (prompt_reuse.save_rows)

    refine = Refinement(engine)
    why = refine.refusal()
    if why:  # a full context, or sliding windows not kept: saved as it is, never refined
        out["refine"] = why
    else:
        waits = _refine_with_arrivals(refine)
        out["refine_ms"] = round(sum(refine.step_s) * 1000)
        out["refine_share_of_exact"] = round(out["refine_ms"] / max(1, out["exact_prompt_ms"]), 3)
        out["refine_share_of_exact_here"] = round(out["refine_ms"] / max(1, out["exact_prompt_ms_here"]), 3)
        out["longest_chunk_ms"] = round(max(refine.step_s, default=0.0) * 1000)
        out["chunks_ms"] = [round(s * 1000) for s in refine.step_s]  # in prompt order, stopped ones left out
        out["preempt_wait_ms"] = [round(w * 1000, 1) for w in waits]
        out["kl_after_refine"] = _kl_against_exact(engine)
        work.after_completion()
        work.run()  # saved again, exact
        _entry_size(out, cache, engine)

    again = _chat(args, doc, QUESTIONS[1], cache_dir)
    out["reopened_ttft_ms"], out["reopened_cache_n"] = round(again["ttft_ms"]), again["cache_n"]
    out["reopened_prompt_tokens"] = again["prompt_n"] + again["cache_n"]
    out["reopened_ttft_share_of_cold"] = round(again["ttft_ms"] / max(1.0, cold[1]["ttft_ms"]), 3)
    out["reopened_note"] = again["note"]
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"  {k:<30} {v}")
    return 0


def _refine_with_arrivals(refine) -> list[float]:
    """Refines to the end; during PREEMPTIONS of the chunks (spread over the document) a task "arrives"
    at a random moment of the chunk: the seconds from its arrival until the engine is free again."""
    import random

    from backend.errors import Preempted

    rng, waits = random.Random(0), []
    n_chunks = -(-len(refine.engine.slot.record) // refine.engine.ubatch_rows)
    arrive_in = {max(1, round(n_chunks * (i + 1) / (PREEMPTIONS + 1))) for i in range(PREEMPTIONS)}
    chunk = 0
    while not refine.done:
        chunk += 1
        if chunk not in arrive_in or not refine.step_s:
            refine.step()
            continue
        arrival = time.perf_counter() + rng.uniform(0.1, 0.9) * refine.step_s[-1]
        try:
            refine.step(abort=lambda: time.perf_counter() >= arrival)
        except Preempted:
            waits.append(time.perf_counter() - arrival)
    return waits


def _kl_against_exact(engine) -> float:
    """KL of the next-token logits of the refined cache against an exact prefill of the same tokens."""
    import numpy as np

    toks = engine.slot.tokens
    engine.slot.prefill(toks)  # reuses every refined row, decodes the last
    refined = engine.last_logits()
    engine.slot.prefill(toks, reuse_prefix=False)
    exact = engine.last_logits()
    p = exact.astype(np.float64) - exact.max()
    q = refined.astype(np.float64) - refined.max()
    p -= np.log(np.exp(p).sum())
    q -= np.log(np.exp(q).sum())
    return float((np.exp(p) * (p - q)).sum())


def _entry_size(out: dict, cache, engine) -> None:
    """The saved entry's bytes per 1,000 tokens, from the first entry saved (approximated where it was)."""
    entries = cache.entries()
    if entries and "bytes_per_1000_tokens" not in out:
        out["bytes_per_1000_tokens"] = round(entries[0].n_bytes / len(engine.slot.record) * 1000)
