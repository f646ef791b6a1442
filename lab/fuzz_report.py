"""What every fuzzer of the lab shares (fuzz-readers, fuzz-configs, fuzz-remote, fuzz-server): its options, the
check that Hypothesis is installed, a finding counted once per kind with its first input, and the report printed
at the end. A run's figures are a dict (new_stats()): inputs, outcomes by name, findings by kind, the slowest
input, and whether --minutes ran out.
"""
from __future__ import annotations

import importlib.util
import resource
import sys
import time
import traceback
from pathlib import Path


def add_options(p, examples: int, examples_of: str = "inputs", minutes: bool = True) -> None:
    """--examples, --seed and (with `minutes`) --minutes, as each fuzzer takes them."""
    p.add_argument("--examples", type=int, default=examples, help=f"{examples_of} to try (default {examples:,})")
    p.add_argument("--seed", type=int, default=0, help="Hypothesis seed (the same seed gives the same inputs)")
    if minutes:
        p.add_argument("--minutes", type=float, default=0, help="stop after this many minutes (default: no limit)")


def hypothesis_missing(command: str) -> bool:
    """True, with the error printed, when Hypothesis (a test extra) is not installed."""
    if importlib.util.find_spec("hypothesis") is not None:
        return False
    print(f"error: {command} needs hypothesis: pip install -e '.[test]'", file=sys.stderr)
    return True


def new_stats() -> dict:
    return {"inputs": 0, "outcomes": {}, "findings": {}, "slowest_s": 0.0}


def count(stats: dict, outcome: str, started: float) -> None:
    """One input's `outcome`, tried from perf_counter() `started`."""
    stats["inputs"] += 1
    stats["outcomes"][outcome] = stats["outcomes"].get(outcome, 0) + 1
    stats["slowest_s"] = max(stats["slowest_s"], time.perf_counter() - started)


def finding(stats: dict, exc: BaseException, data, prefix: str = "") -> str:
    """Count `exc`, raised by input `data`, under its kind (the first input of a kind is kept); "finding"."""
    found = stats["findings"].setdefault(prefix + finding_key(exc), {"count": 0, "message": str(exc)[:200],
                                                                     "input": repr(data)[:400]})
    found["count"] += 1
    return "finding"


def finding_key(exc: BaseException) -> str:
    """An exception's type and the deepest frame in this project's code (where to fix it)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if any(part in f.filename for part in ("/backend/", "/app/", "/lab/commands/"))]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno} {frames[-1].name}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def findings_count(stats: dict) -> int:
    return sum(f["count"] for f in stats["findings"].values())


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


def report(name: str, stats: dict, seconds: float, seed: int, unit: str = "inputs") -> int:
    """Print the run's line and each kind of finding with its input; the number of findings."""
    n = findings_count(stats)
    outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(stats["outcomes"].items()))
    distinct = f" ({stats['distinct']:,} distinct)" if "distinct" in stats else ""
    print(f"{name}: {stats['inputs']:,} {unit}{distinct} in {seconds:,.0f} s (seed {seed}; {outcomes}); "
          f"{n:,} findings; slowest {stats['slowest_s'] * 1000:,.0f} ms; peak RSS {peak_rss_mb():,.0f} MB"
          + ("; stopped at the time limit" if stats.get("out_of_time") else "")
          + ("; Hypothesis drew no more distinct inputs" if stats.get("out_of_draws") else ""), flush=True)
    for key, f in stats["findings"].items():
        print(f"  FINDING {key} x{f['count']}: {f['message']}\n    input: {f['input']}", flush=True)
    return n
