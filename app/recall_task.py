"""The needle-recall task, run inside the engine process (it needs the engine's tokenizer and context).

Builds EVALS's items (backend/recall/needles.py) on the attached document or a built-in haystack, runs
every item in every mode, streams each scored row back as it is done (so the heatmaps fill live), and
returns the rows with a summary: accuracy per mode and region, and the exact McNemar test (RecallRow
events and the RecallResult are in app/engine_protocol.py).
The runner is EVALS's `backend/recall/run.py: run_recall` (resumable JSONL results).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from app.engine_protocol import RecallRequest, RecallResult, RecallRow
from backend.protocol import ProgressEvent


def _haystack(req: RecallRequest):
    from backend.recall.haystacks import Haystack, corpus_haystack, filler_haystack

    if req.document:
        digest = hashlib.sha256(req.document.encode("utf-8")).hexdigest()[:8]
        return Haystack(f"document-{digest}", req.document.strip())
    return filler_haystack() if req.extra.get("haystack") == "filler" else corpus_haystack()


def summarize(rows: list[dict], modes: list[str]) -> dict:
    """Accuracy per mode and region, and McNemar between the first two modes on the same items."""
    from backend.recall.stats import paired_table

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


def default_results_path() -> Path:
    from backend.user_paths import data_dir

    p = data_dir() / "recall"
    p.mkdir(parents=True, exist_ok=True)
    return p / "gui-recall.jsonl"


def run_recall_task(engine, req: RecallRequest, on_event, cancel) -> RecallResult:
    """EVALS's runner over the items; results append to a JSONL file, so a rerun of the same grid
    (same items, modes, split, tail) resumes instead of repeating finished answers."""
    from backend.recall.needles import make_items
    from backend.recall.run import run_recall

    t0 = time.perf_counter()
    items = make_items(engine, lengths=req.lengths, depths=req.depths, variants=["single"],
                       haystack=_haystack(req), reps=int(req.extra.get("reps", 1)))

    def on_progress(p) -> None:
        if p.record is not None:
            on_event(RecallRow(p.done, p.total, p.record))
        on_event(ProgressEvent(p.done, p.total, (time.perf_counter() - t0) * 1000, "recall"))

    out = Path(req.out_path) if req.out_path else default_results_path()
    with engine.scratch():  # items ran without prefix reuse; the next chat starts clean
        rows = run_recall(engine, items, req.modes, req.split, req.tail, out, on_progress, cancel)
    return RecallResult(rows, summarize(rows, req.modes), str(out))
