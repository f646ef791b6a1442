"""The loop every file fuzzer of the lab runs (fuzz-readers, fuzz-configs): Hypothesis draws the inputs with a
seed, each is checked in a scratch folder under a CPU-time limit, a finding (a hang included) is counted and the
run goes on, and --minutes stops it. The figures are lab/fuzz_report.py's."""
from __future__ import annotations

import math
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable

from lab.fuzz_report import count, finding, findings_count, new_stats, peak_rss_mb

INPUT_S = 10  # an input past this many CPU seconds is a Hang (CPU: a loaded machine's pauses are not hangs)
ALARM_AGAIN_S = 1.0  # CPU seconds between alarms once an input has passed INPUT_S
# draws allowed per distinct input asked for, where repeats are skipped: fuzz-configs drew 73 distinct of 200
# (docs/HARDENING.md, the config files' fuzz)
DRAWS_PER_DISTINCT = 4


class Hang(Exception):
    """An input past its CPU seconds (raised inside the check by SIGPROF): a finding."""


class OutOfTime(BaseException):
    """The run's time budget is spent (a BaseException: Hypothesis stops at once, as for Ctrl-C)."""


class Enough(BaseException):
    """The run has checked the inputs it was asked for."""


def _hang(signum, frame):
    raise Hang("still running after its time limit")


def run_inputs(name: str, strategy, check: Callable[[object, Path], str], examples: int, seed: int = 0,
               minutes: float = 0, input_s: float = INPUT_S, batch: int = 1, progress_s: float = 0,
               unique: bool = True, skip_repeats: bool = False) -> dict:
    """`examples` inputs of `strategy` through `check(data, folder)` (fewer if `minutes` run out); the figures,
    with how many inputs were distinct. `batch`: inputs per Hypothesis example (its bookkeeping per example is
    shared by them); `progress_s`: print the count this often (0: never); `unique`: a batch's inputs differ
    (as the readers' runs were recorded); `skip_repeats`: an input met before is neither checked nor counted, so
    the run checks `examples` distinct inputs (Hypothesis draws small inputs again and again)."""
    from hypothesis import HealthCheck, Phase, given, seed as hseed, settings, strategies as st

    stats, seen = new_stats(), set()  # the inputs' hashes: batches may repeat one
    work = Path(tempfile.mkdtemp(prefix=f"ridgefill-fuzz-{name}-"))
    started_at = shown = time.monotonic()
    deadline = started_at + minutes * 60 if minutes else math.inf

    def one(data) -> None:
        if skip_repeats and hash(data) in seen:
            return
        started = time.perf_counter()
        try:
            # again every ALARM_AGAIN_S: an alarm that falls in a gc callback is swallowed (docs/HARDENING.md)
            signal.setitimer(signal.ITIMER_PROF, input_s, ALARM_AGAIN_S)
            outcome = check(data, work)
        except Exception as exc:  # a finding: counted with its input, the run goes on
            outcome = finding(stats, exc, data)
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            for p in work.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        seen.add(hash(data))
        count(stats, outcome, started)

    @hseed(seed)
    @settings(max_examples=-(-examples // batch) * (DRAWS_PER_DISTINCT if skip_repeats else 1), database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(st.lists(strategy, min_size=batch, max_size=batch, unique=unique))
    def some(inputs) -> None:
        nonlocal shown
        for data in inputs:
            if stats["inputs"] >= examples:
                break
            if time.monotonic() > deadline:
                raise OutOfTime
            one(data)
        if progress_s and time.monotonic() - shown > progress_s:
            shown = time.monotonic()
            print(f"  {name}: {stats['inputs']:,} inputs after {(shown - started_at) / 60:,.1f} min, "
                  f"{findings_count(stats)} findings, peak RSS {peak_rss_mb():,.0f} MB", flush=True)
        if stats["inputs"] >= examples:
            raise Enough

    previous = signal.signal(signal.SIGPROF, _hang)
    try:
        some()
    except Enough:
        pass
    except OutOfTime:
        stats["out_of_time"] = True
    finally:
        signal.signal(signal.SIGPROF, previous)
        shutil.rmtree(work, ignore_errors=True)
    short = not stats.get("out_of_time") and stats["inputs"] < examples  # every draw spent on repeats
    return {**stats, "distinct": len(seen), **({"out_of_draws": True} if short else {})}
