"""Prefill benchmark: exact vs RidgeFill on the same prompt, side by side in one run.

    PYTHONPATH=. python -m backend.ridgefill.bench --tokens 4096 --split 18 --tail 512

`plumb` times include an exact capture of the true late-layer inputs (it is an oracle); its
"mechanics" figure leaves the capture out: lower layers + writes + tail, what `speed` costs minus the
ridge prediction. `speed` runs when a verified map set for the split is found.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from ..corpus import corpus_texts
from ..engine import Engine, EngineConfig
from ..model_file import embedded_model_path
from .injection import ridgefill_prefill


def prompt_tokens(engine: Engine, n: int) -> list[int]:
    text = "\n\n".join(corpus_texts())
    toks = engine.tokenize(text)
    while len(toks) < n:
        toks += engine.tokenize(text, add_special=False)
    return toks[:n]


def run(model: str, n_tokens: int, split: int, tail: int, repeats: int, threads: int | None) -> dict:
    cfg = EngineConfig(model, n_ctx=max(n_tokens + 64, 2048))
    if threads:
        cfg.n_threads = threads
    engine = Engine(cfg)
    toks = prompt_tokens(engine, n_tokens)
    maps = None
    try:
        from .maps import find_maps

        maps = find_maps(model, split)
    except Exception as exc:  # missing/refused maps: speed is skipped, and we say why
        print(f"speed skipped: {exc}")
    rows: dict[str, list[float]] = {"off": [], "plumb_mechanics": [], "speed": []}
    breakdown: dict[str, dict] = {}
    for _ in range(repeats):  # interleaved, so drift in machine load hits every mode alike
        t0 = time.perf_counter()
        engine.prefill(toks, reuse_prefix=False)
        rows["off"].append((time.perf_counter() - t0) * 1000)
        rep = ridgefill_prefill(engine, toks, "plumb", split, tail)
        if rep.mode != "plumb":
            raise SystemExit(f"RidgeFill did not run: {rep.note}")
        rows["plumb_mechanics"].append(rep.prompt_ms - rep.breakdown_ms["capture"])
        breakdown["plumb"] = rep.breakdown_ms
        if maps is not None:
            rep = ridgefill_prefill(engine, toks, "speed", split, tail, maps=maps)
            rows["speed"].append(rep.prompt_ms)
            breakdown["speed"] = rep.breakdown_ms
    engine.close()
    med = {k: statistics.median(v) for k, v in rows.items() if v}
    return {
        "model": model, "n_prompt": n_tokens, "split": split, "tail": tail, "repeats": repeats,
        "bulk_n": rep.bulk_n, "median_ms": {k: round(v, 1) for k, v in med.items()},
        "ratio_vs_off": {k: round(med["off"] / v, 3) for k, v in med.items() if k != "off"},
        "breakdown_ms": breakdown,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF path (default: the embedded SmolLM2)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--split", type=int, default=18)
    ap.add_argument("--tail", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run(a.model or str(embedded_model_path()), a.tokens, a.split, a.tail, a.repeats, a.threads)
    if a.json:
        print(json.dumps(res))
        return
    print(f"{res['n_prompt']} tokens, split {res['split']}, tail {res['tail']}, bulk {res['bulk_n']} rows, "
          f"median of {res['repeats']}")
    for k, v in res["median_ms"].items():
        ratio = res["ratio_vs_off"].get(k)
        print(f"  {k:16s} {v:10.0f} ms" + (f"   {ratio:.2f}x vs off" if ratio else ""))
    for k, v in res["breakdown_ms"].items():
        print(f"  breakdown {k}: {v}")


if __name__ == "__main__":
    main()
