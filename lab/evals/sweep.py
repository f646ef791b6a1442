"""The split sweep: for each split S, the time to first token against `off` at one length, bulk-needle
accuracy (with McNemar against `off` on the same items) and ΔNLL, so a user sees the speed-quality curve
and can pick S.

Everything goes through the same resumable JSON lines file (recall, NLL and TTFT lines), so a sweep
that is stopped picks up where it was, and the exact side is run once for every split.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from backend.completion import complete
from backend.errors import Cancelled
from backend.recall.needles import NeedleItem
from backend.recall.run import append_result, load_results, result_key, reusable, run_recall
from backend.recall.stats import paired_table
from lab.evals.nll import NllDocument, run_nll


@dataclass
class SweepProgress:
    stage: str  # "ttft", "recall", "nll", "maps"
    split: int | None
    done: int
    total: int


def ensure_maps(engine, split: int, fit: bool, on_progress: Callable | None = None, cancel=None) -> str:
    """'found', 'fitted', or why there are none (speed then runs exact and the row says so)."""
    from backend.ridgefill.maps import MapsMissing, MapsRefused, find_maps

    try:
        find_maps(engine.info.path, split)
        return "found"
    except MapsRefused as exc:
        return f"refused: {exc}"
    except MapsMissing as exc:
        if not fit:
            return f"missing: {exc}"
    from backend.ridgefill.fitting import fit_map_set

    fit_map_set(engine.info.path, split, on_progress=on_progress, cancel=cancel, engine=engine)
    return "fitted"


def measure_ttft(engine, item: NeedleItem, mode: str, split: int | None, tail: int | None, out_path: Path,
                 repeats: int = 1, cancel=None, tag: str = "") -> dict:
    """Time to first token of one prompt (the best of `repeats` runs: the least disturbed by other load)."""
    probe = {"kind": "ttft", "id": f"ttft-{item.id}-x{repeats}{tag}", "mode": mode, "split": split, "tail": tail}
    for rec in load_results(out_path):
        if rec.get("kind") == "ttft" and result_key(rec) == result_key(probe) and reusable(rec):
            return rec
    best = None
    for _ in range(repeats):
        if cancel is not None and cancel():
            raise Cancelled("sweep cancelled")
        req = item.request(mode, split, tail)
        req.max_tokens = 1
        res = complete(engine, req, cancel=cancel)
        if best is None or res.timings.ttft_ms < best.timings.ttft_ms:
            best = res
    t = best.timings
    rec = {**probe, "split": split if mode != "off" else None, "length": item.length, "ttft_ms": round(t.ttft_ms, 1),
           "prompt_ms": round(t.prompt_ms, 1), "mode_run": t.mode, "bulk_n": t.bulk_n, "note": t.note,
           "repeats": repeats}
    append_result(out_path, rec)
    return rec


def run_sweep(engine, *, splits: list[int], tail: int, ttft_item: NeedleItem | None, items: list[NeedleItem],
              docs: list[NllDocument], out_path: str | Path, mode: str = "speed", fit: bool = False,
              repeats: int = 1, on_progress: Callable[[SweepProgress], None] | None = None,
              cancel: Callable[[], bool] | None = None) -> dict:
    """One row per split (and the exact baseline): TTFT ratio off/mode at `ttft_item`'s length,
    bulk-needle accuracy on `items` (only needles in the bulk count), ΔNLL on `docs` with its CI.

    Without a `ttft_item` the ratio is mean TTFT off / mean TTFT mode over the needle items' own runs
    (cheaper, but the two sides did not run back to back)."""
    out = Path(out_path)
    started = time.perf_counter()

    def report(stage, split, done, total):
        if on_progress is not None:
            on_progress(SweepProgress(stage, split, done, total))

    off_recall = run_recall(engine, items, ["off"], None, tail, out,
                            on_progress=lambda p: report("recall", None, p.done, p.total), cancel=cancel)
    off_by_id = {r["id"]: r for r in off_recall}
    rows = []
    for s in splits:
        maps = ensure_maps(engine, s, fit, cancel=cancel,
                           on_progress=lambda stage, d, t, s=s: report(f"maps:{stage}", s, d, t))
        rec = run_recall(engine, items, [mode], s, tail, out,
                         on_progress=lambda p, s=s: report("recall", s, p.done, p.total), cancel=cancel)
        if ttft_item is not None:
            # exact and RidgeFill back to back, so both see the same load on the machine
            report("ttft", s, 0, 2)
            off_ttft = measure_ttft(engine, ttft_item, "off", None, tail, out, repeats, cancel, tag=f"-S{s}")
            tt = measure_ttft(engine, ttft_item, mode, s, tail, out, repeats, cancel)
            report("ttft", s, 2, 2)
        else:
            n = len(rec)
            off_ttft = {"ttft_ms": sum(off_by_id[r["id"]]["ttft_ms"] for r in rec) / n}
            tt = {"ttft_ms": sum(r["ttft_ms"] for r in rec) / n, "mode_run": rec[0]["mode_run"],
                  "note": rec[0]["note"]}
        bulk = [r for r in rec if r["region"] == "bulk"]
        table = paired_table([bool(off_by_id[r["id"]]["correct"]) for r in bulk], [bool(r["correct"]) for r in bulk])
        nll = run_nll(engine, docs, mode, s, tail, out,
                      on_progress=lambda p, s=s: report("nll", s, p.done, p.total), cancel=cancel) if docs else {}
        rows.append({
            "split": s, "tail": tail, "maps": maps, "mode_run": tt["mode_run"], "note": tt["note"],
            "ttft_ms": tt["ttft_ms"], "ttft_off_ms": off_ttft["ttft_ms"],
            "ttft_ratio": off_ttft["ttft_ms"] / tt["ttft_ms"] if tt["ttft_ms"] else None,
            "bulk_items": len(bulk), "bulk_correct": sum(bool(r["correct"]) for r in bulk),
            "bulk_acc": sum(bool(r["correct"]) for r in bulk) / len(bulk) if bulk else None,
            "off_bulk_acc": (table["both"] + table["a_only"]) / table["n"] if table["n"] else None,
            "p_mcnemar": table["p_mcnemar"],
            "dnll": nll.get("delta"), "dnll_lo": nll.get("ci_lo"), "dnll_hi": nll.get("ci_hi"),
            "nll_docs": nll.get("n_docs", 0),
        })
    off_acc = [bool(r["correct"]) for r in off_recall if r["region"] == "bulk"]
    return {"model": engine.info.name, "length": ttft_item.length if ttft_item else None,
            "ttft_paired": ttft_item is not None, "tail": tail, "mode": mode,
            "off_bulk_acc": sum(off_acc) / len(off_acc) if off_acc else None, "off_bulk_items": len(off_acc),
            "rows": rows, "seconds": round(time.perf_counter() - started, 1)}
