"""The recall runner: needle items through the engine in each mode, one JSON line per (item, mode).

Lines are appended (and flushed) as items finish, so an interrupted run resumes where it stopped:
a line already in the file for the same item, mode, split and tail is not run again.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ..completion import complete
from ..errors import Cancelled, RidgeFillError
from .needles import NeedleItem
from .scoring import score

log = logging.getLogger(__name__)


@dataclass
class RecallProgress:
    done: int  # (item, mode) runs finished, resumed ones included
    total: int
    record: dict | None  # the line just written; None for a resumed (skipped) run


def result_key(rec: dict) -> tuple:
    """What makes a result line unique. An exact run does not depend on split or tail."""
    if rec["mode"] == "off":
        return (rec["id"], "off", None, None)
    return (rec["id"], rec["mode"], rec.get("split"), rec.get("tail"))


def reusable(rec: dict) -> bool:
    """Whether a line may stand in for a rerun: an exact line, or one whose mode really ran or was
    refused with a stated reason (not one from an engine that ignored the mode without a word)."""
    return rec["mode"] == "off" or rec.get("mode_run") == run_mode(rec["mode"]) or bool(rec.get("note"))


# "guided+answer": guided with the asked answer's rows made exact as well as what the question chose, an
# oracle telling a lost answer whose rows were not selected from one lost around them (issue 37)
ORACLE = "+answer"


def run_mode(mode: str) -> str:
    """The mode a request runs in for a recall mode (the oracle's is guided)."""
    return mode.removesuffix(ORACLE)


def answer_plan(engine, item: NeedleItem, request):
    """The oracle's plan: the request's own, with the asked needles' rows made exact too."""
    from ..prefill import ExactPrefill
    from ..ridgefill.plan import RidgeFillPlan, plan_prefill

    plan = plan_prefill(engine, request, item.length)
    if not isinstance(plan, RidgeFillPlan) or plan.mode != "guided":
        why = plan.note if isinstance(plan, ExactPrefill) else f"it plans {plan.mode}"
        raise RidgeFillError(f"the {ORACLE} oracle needs guided mode to run: {why or 'it plans exact'}")
    rows = tuple(p for n in item.asked for p in range(n.start, n.end))
    return replace(plan, guided=replace(plan.guided, also_rows=rows))


def load_results(path: str | Path) -> list[dict]:
    """Every well-formed line of a results file (a line cut short by an interruption is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    with p.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping a malformed line (an interrupted write?)", p, i)
                continue
            if isinstance(rec, dict) and {"id", "mode"} <= rec.keys():  # recall, nll and ttft lines
                out.append(rec)
    return out


def append_result(path: Path, rec: dict) -> None:
    """One result line at the end of a results file (a rerun resumes from them), on a line of its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab+") as f:
        f.seek(0, 2)
        if f.tell() > 0:  # a previous run killed mid-line: start on a fresh line
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write((json.dumps(rec, ensure_ascii=False) + "\n").encode("utf-8"))
        f.flush()


def effective_tail(engine, length: int, tail: int | None) -> int | None:
    """The rows that really run exact in `speed` (RidgeFill's own rule, see injection.bulk_rows): all of
    them when the prompt is too short for RidgeFill. Regions are labelled with it, so a "bulk" needle
    was approximated."""
    if not tail:
        return tail
    from ..ridgefill.defaults import MIN_BULK
    from ..ridgefill.injection import bulk_rows

    bulk = bulk_rows(engine, length, tail)
    return length if bulk < MIN_BULK else length - bulk


def run_item(engine, item: NeedleItem, mode: str, split: int | None, tail: int | None,
             cancel: Callable[[], bool] | None = None, shared: SharedDocuments | None = None) -> dict:
    """Run one item in one mode and return its result line. `shared`: items of one document restore its
    rows' prefill instead of running it again (the answer is the same; the times are not prefill times)."""
    t0 = time.perf_counter()
    request = item.request(run_mode(mode), split, tail)
    plan = answer_plan(engine, item, request) if mode.endswith(ORACLE) else None
    if shared is not None:
        result = shared.complete(item, request, cancel, plan)
    else:
        result = complete(engine, request, cancel=cancel, plan=plan)
    if result.finish_reason == "cancelled":  # a half answer must not be scored or saved
        raise Cancelled(f"item {item.id} cancelled while answering")
    if result.prompt_tokens != item.length:  # the item was built for another tokenizer or template
        raise RidgeFillError(f"item {item.id} is {result.prompt_tokens} tokens for this model, not {item.length}; "
                             "build the items with the engine that runs them")
    kind = {"uuid": "uuid", "question": "phrase"}.get(item.variant, "number")
    correct, answer = score(result.text, item.answers, kind)
    t = result.timings
    rec = {
        "kind": "recall", **item.meta(effective_tail(engine, item.length, tail)),
        "mode": mode, "split": split if mode != "off" else None, "tail": tail,
        "correct": correct, "answer": answer, "reply": result.text,
        "mode_run": t.mode, "bulk_n": t.bulk_n, "note": t.note, "cache_n": t.cache_n,
        "ttft_ms": round(t.ttft_ms, 1), "prompt_ms": round(t.prompt_ms, 1),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if t.mode in ("quality", "guided"):  # the hit on this very item: were the answer's rows made exact?
        record = engine.slot.record
        rec["answer_exact"] = not any(record.approximated(n.start, n.end) for n in item.asked)
    return rec


class SharedDocuments:
    """The rows each item shares with the other items of its document (0: none), and the saved prefills
    of them."""

    def __init__(self, engine, items: list[NeedleItem], tail: int | None):
        from ..ridgefill.defaults import tail_or_default
        from .prefix_snapshot import PrefixSnapshots, shared_rows

        self.snapshots = PrefixSnapshots(engine)
        groups: dict[str, list[NeedleItem]] = {}
        for item in items:
            if item.document is not None:
                groups.setdefault(item.document, []).append(item)
        t = tail_or_default(engine.info, tail)
        self._shared_n = {}
        for group in groups.values():
            n = shared_rows(engine, [engine.prompt_tokens(i.request()) for i in group], t) if len(group) > 1 else 0
            self._shared_n.update({i.id: n for i in group})

    def rows(self, item: NeedleItem) -> int:
        return self._shared_n.get(item.id, 0)

    def complete(self, item: NeedleItem, request, cancel: Callable[[], bool] | None = None, plan=None):
        """`request`, the item's, answered from its document's restored prefill where it shares rows with
        other items, else by a fresh run."""
        shared_n = self.rows(item)
        if shared_n:
            return self.snapshots.complete(request, shared_n, cancel, plan=plan)
        return complete(self.snapshots.engine, request, cancel=cancel, plan=plan)


def run_recall(engine, items: list[NeedleItem], modes: list[str], split: int | None, tail: int | None,
               out_path: str | Path, on_progress: Callable[[RecallProgress], None] | None = None,
               cancel: Callable[[], bool] | None = None, share_documents: bool = True) -> list[dict]:
    """Run every item in every mode (item by item, so pairs finish together) and return the lines for
    these items and modes, read back from `out_path` (earlier runs included). Raises Cancelled; what
    finished stays in the file. `share_documents`: questions about one document restore its prefill
    (SharedDocuments) instead of running it again."""
    out = Path(out_path)
    shared = SharedDocuments(engine, items, tail) if share_documents else None
    done = {result_key(r): r for r in load_results(out) if reusable(r)}
    total = len(items) * len(modes)
    n = 0
    results = []
    for item in items:
        for mode in modes:
            probe = {"id": item.id, "mode": mode, "split": split, "tail": tail}
            rec = done.get(result_key(probe))
            if rec is None:
                if cancel is not None and cancel():
                    raise Cancelled(f"recall run cancelled after {n} of {total} runs; rerun to resume")
                rec = run_item(engine, item, mode, split, tail, cancel, shared)
                append_result(out, rec)
                done[result_key(rec)] = rec
                n += 1
                if on_progress is not None:
                    on_progress(RecallProgress(n, total, rec))
            else:
                # an exact line may come from a run with another tail: label it for this one
                rec = {**rec, "region": item.region(effective_tail(engine, item.length, tail)), "tail": tail}
                n += 1
                if on_progress is not None:
                    on_progress(RecallProgress(n, total, None))
            results.append(rec)
    return results
