"""The needle-recall task, run inside the engine process (it needs the engine's tokenizer and context).

Builds EVALS's items (backend/evals/needles.py) on the attached document or a built-in haystack, runs
every item in every mode, streams each scored row back as it is done (so the heatmaps fill live), and
returns the rows with a summary: accuracy per mode and region, and the exact McNemar test.
Uses EVALS's runner `backend/evals/recall.py: run_recall` when it is installed, else a minimal loop
over the same items, request and scorer.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from backend.protocol import ProgressEvent


@dataclass
class RecallRow:
    """One scored (item, mode) pair, sent while the run goes on."""

    done: int
    total: int
    row: dict


@dataclass
class RecallResult:
    rows: list[dict]
    summary: dict
    out_path: str | None = None
    notes: list[str] = field(default_factory=list)


def _haystack(req):
    from backend.evals.haystacks import Haystack, corpus_haystack, filler_haystack

    if req.document:
        digest = hashlib.sha256(req.document.encode("utf-8")).hexdigest()[:8]
        return Haystack(f"document-{digest}", req.document.strip())
    return filler_haystack() if req.extra.get("haystack") == "filler" else corpus_haystack()


def summarize(rows: list[dict], modes: list[str]) -> dict:
    """Accuracy per mode and region, and McNemar between the first two modes on the same items."""
    from backend.evals.stats import paired_table

    acc: dict = {}
    for m in modes:
        for region in ("bulk", "tail", "all"):
            sel = [r["correct"] for r in rows if r["mode"] == m and (region == "all" or r["region"] == region)]
            acc[f"{m}/{region}"] = {"n": len(sel), "correct": sum(sel), "accuracy": sum(sel) / len(sel) if sel else None}
    out = {"accuracy": acc, "modes": modes}
    if len(modes) >= 2:
        by = {m: {r["id"]: r["correct"] for r in rows if r["mode"] == m} for m in modes[:2]}
        ids = sorted(set(by[modes[0]]) & set(by[modes[1]]))
        out["paired"] = paired_table([by[modes[0]][i] for i in ids], [by[modes[1]][i] for i in ids])
        bulk_ids = [i for i in ids if any(r["id"] == i and r["region"] == "bulk" for r in rows)]
        out["paired_bulk"] = paired_table([by[modes[0]][i] for i in bulk_ids], [by[modes[1]][i] for i in bulk_ids])
    return out


def run_recall_task(engine, req, on_event, cancel) -> RecallResult:
    from backend.errors import Cancelled
    from backend.evals.needles import make_items
    from backend.evals.scoring import score

    t0 = time.perf_counter()
    items = make_items(engine, lengths=req.lengths, depths=req.depths, variants=["single"],
                       haystack=_haystack(req), reps=int(req.extra.get("reps", 1)))
    total = len(items) * len(req.modes)
    rows: list[dict] = []
    for item in items:
        for mode in req.modes:
            if cancel():
                raise Cancelled(f"recall run cancelled after {len(rows)} of {total} answers")
            split = req.split if mode != "off" else None
            tail = req.tail if mode != "off" else None
            res = engine.complete(item.request(mode, split, tail), cancel=cancel)
            if res.finish_reason == "cancelled":
                raise Cancelled(f"recall run cancelled after {len(rows)} of {total} answers")
            ok, got = score(res.text, item.answers, "uuid" if item.variant == "uuid" else "number")
            row = {**item.meta(req.tail), "mode": mode, "mode_ran": res.timings.mode, "correct": bool(ok),
                   "answer": got, "reply": res.text, "ttft_ms": res.timings.ttft_ms,
                   "bulk_n": res.timings.bulk_n, "note": res.timings.note}
            rows.append(row)
            on_event(RecallRow(len(rows), total, row))
            on_event(ProgressEvent(len(rows), total, (time.perf_counter() - t0) * 1000, "recall"))
    result = RecallResult(rows, summarize(rows, req.modes))
    if req.out_path:
        write_json(result, req, Path(req.out_path))
        result.out_path = req.out_path
    return result


def write_json(result: RecallResult, req, path: Path) -> None:
    data = {"lengths": req.lengths, "depths": req.depths, "modes": req.modes, "split": req.split,
            "tail": req.tail, "summary": result.summary, "rows": result.rows}
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)
