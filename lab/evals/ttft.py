"""TTFT benchmark: `off` against a RidgeFill mode on the same prompts, interleaved in one run.

The machines are shared and noisy, so both modes are measured side by side (alternating which goes
first), each prompt is fresh (no prefix reuse), and the median of the repeats is reported with the ratio.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from backend.completion import complete
from backend.recall.haystacks import corpus_haystack
from backend.recall.needles import build_item


@dataclass
class TtftRow:
    n_prompt: int
    off_ttft_ms: float
    speed_ttft_ms: float
    ratio: float  # off / speed: above 1 means RidgeFill answers sooner
    off_prompt_per_second: float
    speed_mode_run: str  # "speed", or "off" when RidgeFill was refused for this prompt (note says why)
    bulk_n: int
    note: str = ""
    breakdown_ms: dict = field(default_factory=dict)
    off_runs_ms: list[float] = field(default_factory=list)
    speed_runs_ms: list[float] = field(default_factory=list)
    split: int | None = None  # the split that ran


def run_ttft_bench(engine, lengths: list[int], *, split: int | None, tail: int | None, mode: str = "speed",
                   repeats: int = 3, on_progress: Callable[[str], None] | None = None,
                   cancel: Callable[[], bool] | None = None, exact_engine=None,
                   settings: list[str] | None = None) -> list[TtftRow]:
    """`exact_engine`: where `off` runs (the same model; default `engine`). `settings`: several RidgeFill
    settings (guided:5, guided:6w, ...: fidelity.parse_setting) timed against the same exact runs, a row
    each per length; default `mode` at `split`."""
    from backend.ridgefill.runtime import warm_up
    from backend.tuning.fidelity import parse_setting

    variants = {name: parse_setting(name) for name in (settings or [mode])}
    if not settings:
        variants[mode] = replace(variants[mode], split=split)
    exact_engine = exact_engine or engine
    for v in variants.values():  # one-time set-up (layout probe, weights, maps) stays out of the timings
        warm_up(engine, v.split if v.split is not None else split)
    hay, cache = corpus_haystack(), {}
    # One short exact request first: the first decode of a context pays one-off set-up costs.
    for e in {id(engine): engine, id(exact_engine): exact_engine}.values():
        complete(e, build_item(engine, length=256, depth=0.5, haystack=hay, _hay_cache=cache).request("off"),
                 cancel=cancel)
    rows = []
    for n in lengths:
        item = build_item(engine, length=n, depth=0.5, haystack=hay, _hay_cache=cache)
        runs: dict[str, list] = {"off": [], **{name: [] for name in variants}}
        for r in range(repeats):
            for name in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                if on_progress is not None:
                    on_progress(f"{n} tokens, {name}, run {r + 1}/{repeats}")
                v = variants.get(name)
                req = item.request("off") if v is None else item.request(v.mode, v.split if v.split is not None
                                                                         else split, tail)
                req.max_tokens, req.reuse_prefix = 1, False
                if v is not None:
                    req.window_bulk = v.window_bulk
                runs[name].append(complete(exact_engine if v is None else engine, req, cancel=cancel).timings)
        rows += [_row(n, runs["off"], runs[name]) for name in variants]
    return rows


def _row(n: int, off: list, fast: list) -> TtftRow:
    off_ms = statistics.median(t.ttft_ms for t in off)
    fast_ms = statistics.median(t.ttft_ms for t in fast)
    mid = sorted(fast, key=lambda t: t.ttft_ms)[len(fast) // 2]
    return TtftRow(
        n_prompt=n, off_ttft_ms=round(off_ms, 1), speed_ttft_ms=round(fast_ms, 1), ratio=round(off_ms / fast_ms, 3),
        off_prompt_per_second=round(statistics.median(t.prompt_per_second for t in off), 1),
        speed_mode_run=mid.mode, bulk_n=mid.bulk_n, note=mid.note,
        breakdown_ms={k: round(v, 1) for k, v in (mid.breakdown_ms or {}).items()},
        off_runs_ms=[round(t.ttft_ms, 1) for t in off], speed_runs_ms=[round(t.ttft_ms, 1) for t in fast],
        split=mid.split)


def rows_as_dicts(rows: list[TtftRow]) -> list[dict]:
    return [asdict(r) for r in rows]


@dataclass
class DocumentTtft:
    document: str
    row: TtftRow


def run_document_ttft(engine, docs, *, repeats: int = 1, on_progress: Callable[[str], None] | None = None,
                      exact_engine=None) -> list[DocumentTtft]:
    """Each document's first question, fresh (no prefix reuse), exact against the app's default request
    (mode "default": the planner's choice, the guard included; RidgeFill as switched on where the model runs
    exact by default), alternating which goes first: the TTFT a user waits for on that document at its own
    length."""
    from backend.protocol import MODEL_DEFAULT
    from backend.ridgefill.defaults import default_mode, switched_on_mode
    from backend.ridgefill.runtime import warm_up
    from backend.tuning.fidelity import item_request, parse_setting

    exact_engine = exact_engine or engine
    warm_up(engine)
    fast = MODEL_DEFAULT if default_mode(engine.info) != "off" else switched_on_mode(engine.info)
    out = []
    for doc in docs:
        runs: dict[str, list] = {"off": [], fast: []}
        for r in range(repeats):
            for mode in (list(runs) if r % 2 == 0 else list(runs)[::-1]):
                if on_progress is not None:
                    on_progress(f"{doc.name}, {mode}, run {r + 1}/{repeats}")
                req = replace(item_request(doc, doc.questions[0].question, parse_setting("off")), mode=mode,
                              max_tokens=1, reuse_prefix=False)
                runs[mode].append(complete(exact_engine if mode == "off" else engine, req).timings)
        n = runs["off"][0].prompt_n + runs["off"][0].cache_n
        out.append(DocumentTtft(doc.name, _row(n, runs["off"], runs[fast])))
    return out

