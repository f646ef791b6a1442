"""The GPU check (issue 66): exact against the default setting with every layer on the GPU, in one folder.

  python -m lab.gpu_check --out DIR [--model PATH] [--gpu-layers auto] [--lengths 16384,32000]
                          [--split 11] [--documents valgrind-faq,rluserman-manual] [--every 4] [--lift-refusal]

Writes to DIR: env.json (the build, torch's device), device_path.json (a tiny Gemma 3 written here: where
its K/V cache lives, exact against plumb through the same tensors), bench.json (`python -m lab bench`:
TTFT of exact and the mode at --split), fidelity.json and fidelity.jsonl (`python -m lab fidelity`: a few
long-set questions, the mode and q8_0 against exact), and log.txt. `--lift-refusal` runs RidgeFill with
layers on the GPU, which plan.refusal otherwise refuses (the check of whether that refusal can go).
packaging/gpu_check/run.sh builds llama.cpp for CUDA and runs this.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def env_report(gpu_layers) -> dict:
    from importlib.metadata import version

    import torch

    from backend.gpu_offload import build_line, layers_to_offload

    cuda = torch.cuda.is_available()
    return {"llama_cpp": version("llama-cpp-python"), "build": build_line(), "gpu_layers": str(gpu_layers),
            "n_gpu_layers": layers_to_offload(gpu_layers), "torch": torch.__version__,
            "torch_device": torch.cuda.get_device_name(0) if cuda else "cpu", "python": sys.version.split()[0]}


def device_path(gpu_layers) -> dict:
    """A tiny random-weight Gemma 3 (tests/tiny_gguf.py): where its cache lives, and plumb (RidgeFill's
    writes of the true late inputs) against exact on the same engine: KL and the top token."""
    sys.path.insert(0, str(ROOT / "tests"))
    from tiny_gguf import write_tiny_gguf

    with tempfile.TemporaryDirectory() as tmp:  # not in the results folder: it need not come back
        return _plumb_against_exact(write_tiny_gguf(Path(tmp) / "tiny-gemma3.gguf", "gemma3", n_layer=8), gpu_layers)


def _plumb_against_exact(path: Path, gpu_layers) -> dict:
    from backend.engine import Engine, EngineConfig
    from backend.ridgefill.ggml_graph import Node
    from backend.ridgefill.plan import ridgefill_prefill
    from backend.ridgefill.runtime import runtime

    with Engine(EngineConfig(str(path), n_ctx=2048, gpu_layers=gpu_layers)) as engine:
        rt = runtime(engine)
        out = {"n_gpu_layers": engine.n_gpu_layers, "refused": rt.refused}
        if rt.refused is not None:
            return out
        out["cache_on_host"] = Node(rt.layout.layers[0].k_cache.ptr).is_host()
        toks = [1] + [int(t) for t in np.random.default_rng(1).integers(3, 299, 1600)]
        engine.slot.prefill(toks, reuse_prefix=False)
        ref = engine.last_logits().astype(np.float64)
        rep = ridgefill_prefill(engine, toks, "plumb", 6, 512)
        got = engine.last_logits().astype(np.float64)
        p, q = ref - np.logaddexp.reduce(ref), got - np.logaddexp.reduce(got)
        out.update(mode=rep.mode, note=rep.note, kl=float((np.exp(p) * (p - q)).sum()),
                   same_top=bool(ref.argmax() == got.argmax()))
    return out


def lab(argv: list[str], stdout: Path) -> int:
    """One `python -m lab` command in this process (RIDGEFILL_ON_GPU holds for it), its stdout to a file."""
    from lab.cli import run_cli

    with stdout.open("w", encoding="utf-8") as f, contextlib.redirect_stdout(f):
        return run_cli(argv)


def common(args) -> list[str]:
    return (["--model", args.model] if args.model else []) + ["--ctx", str(args.ctx), "--gpu-layers", args.gpu_layers]


def fidelity_every(args) -> int:
    """Every K-th question of each chosen document, so that each gives about --questions."""
    from backend.tuning.question_files import long_set

    docs = [d for d in long_set() if Path(d.name).stem in args.documents.split(",")]
    return max(1, max((len(d.questions) for d in docs), default=1) // max(1, args.questions))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=None, help="GGUF (default: the app's, Gemma 3 270M)")
    ap.add_argument("--gpu-layers", default="auto")
    ap.add_argument("--ctx", type=int, default=32768)
    ap.add_argument("--lengths", default="16384,32000")
    ap.add_argument("--split", type=int, default=11)
    ap.add_argument("--mode", default="speed")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--documents", default="valgrind-faq,rluserman-manual",
                    help="long-set documents for fidelity (judge half); 'none' skips it")
    ap.add_argument("--questions", type=int, default=3, help="about this many questions per document")
    ap.add_argument("--lift-refusal", action="store_true", help="RidgeFill runs with layers on the GPU")
    ap.add_argument("--skip", default="", help="steps to skip: device,bench,fidelity")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from backend.gpu_offload import parse_gpu_layers
    from backend.ridgefill.plan import ON_GPU_ENV

    gpu_layers = parse_gpu_layers(args.gpu_layers)
    summary: dict = {"env": env_report(gpu_layers), "lift_refusal": args.lift_refusal}
    steps = {
        "device": lambda: device_path(gpu_layers),
        "bench": lambda: lab(common(args) + ["bench", "--lengths", args.lengths, "--split", str(args.split),
                                             "--mode", args.mode, "--repeats", str(args.repeats), "--json"],
                             args.out / "bench.json"),
        "fidelity": lambda: lab(common(args) + ["fidelity", "--documents", args.documents, "--every",
                                                str(fidelity_every(args)), "--modes", f"{args.mode}:{args.split},q8",
                                                "--out", str(args.out / "fidelity.jsonl"), "--json"],
                                args.out / "fidelity.json"),
    }
    skip = set(filter(None, args.skip.split(","))) | ({"fidelity"} if args.documents == "none" else set())
    failed = False
    if args.lift_refusal:  # the product's own switch (plan.ON_GPU_ENV), for this process and its engines
        os.environ[ON_GPU_ENV] = "1"
    for name, step in steps.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            summary[name] = step()
        except Exception:  # one step failing leaves the others' results
            summary[name] = {"error": traceback.format_exc()}
            failed = True
        summary[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
        print(f"gpu_check: {name} done in {summary[f'{name}_seconds']} s", file=sys.stderr, flush=True)
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1, default=str), encoding="utf-8")
    print(json.dumps(summary, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
