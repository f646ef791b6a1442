"""How many of a setting's answers the app's check (backend/answer_check.py) marks "checked", and why.

The check compares a RidgeFill answer with exact's own once the document is exact: the same tokens, the
same text (white space aside), or the shown reply's mean NLL on the exact cache within WITHIN_NLL of
exact's own reply's. A fidelity run (`lab fidelity`) already holds both replies of every question; this
scores both on a fresh exact prefill of each document (shared rows prefilled once, restored per
question), where the app scores them on the refined cache (equal up to rounding), and prints the share.
`python -m lab.experiments.check_share FIDELITY.jsonl SETTING OUT.jsonl [HALF]` (resumed by question).
"""
from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

from app.commands.common import open_engine
from backend.answer_check import WITHIN_NLL
from backend.answers import answers_agree
from backend.recall.prefix_snapshot import PrefixSnapshots, shared_rows
from backend.recall.run import append_result, load_results
from backend.reply_score import reply_nll
from backend.tuning.fidelity import EXACT, item_request, parse_setting
from backend.tuning.question_files import long_set


def verdict(exact: dict, shown: dict, dnll: float | None) -> str:
    """The check's reason for "checked", or "corrected" (answer_check.check_answer's rule)."""
    if shown["reply_tokens"] == exact["reply_tokens"]:
        return "same tokens"
    if answers_agree(shown["reply"], exact["reply"]):
        return "same text"
    return "within" if dnll is not None and dnll <= WITHIN_NLL else "corrected"


def score_document(engine, doc, pairs: dict, out: Path) -> None:
    """Both replies of each question in `pairs` (id -> (exact line, shown line)) scored on exact's cache."""
    off = parse_setting(EXACT)
    requests = [replace(item_request(doc, q.question, off), max_tokens=1) for q in doc.questions]
    prompts = [engine.prompt_tokens(r) for r in requests]
    shared_n = shared_rows(engine, prompts, 0) if len(prompts) > 1 else 0
    snapshots = PrefixSnapshots(engine)
    with engine.scratch():
        for q, request, prompt in zip(doc.questions, requests, prompts):
            if q.id not in pairs:
                continue
            t0 = time.perf_counter()
            snapshots.complete(request, shared_n)  # exact's cache for the prompt, its last logits ready
            exact, shown = pairs[q.id]
            exact_nll = reply_nll(engine, prompt, exact["reply_tokens"])
            shown_nll = reply_nll(engine, prompt, shown["reply_tokens"])
            dnll = None if exact_nll is None or shown_nll is None else shown_nll - exact_nll
            append_result(out, {"kind": "check", "id": q.id, "mode": EXACT, "document": doc.name, "setting": shown["setting"],
                                "exact_nll": exact_nll, "shown_nll": shown_nll, "dnll": dnll,
                                "verdict": verdict(exact, shown, dnll), "seconds": round(time.perf_counter() - t0, 2)})


def summary(lines: list[dict]) -> str:
    by_doc, reasons = defaultdict(list), defaultdict(int)
    for r in lines:
        by_doc[r["document"]].append(r["verdict"] != "corrected")
        reasons[r["verdict"]] += 1
    checked = sum(v != "corrected" for v in (r["verdict"] for r in lines))
    rows = [f"  {d}: {sum(v)} of {len(v)} checked" for d, v in sorted(by_doc.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))]
    return "\n".join([f"checked {checked} of {len(lines)} ({checked / max(1, len(lines)):.0%}): "
                      + ", ".join(f"{k} {n}" for k, n in sorted(reasons.items())), *rows])


def main(fidelity: str, setting: str, out: str, half: str = "judge") -> None:
    lines = [r for r in load_results(Path(fidelity)) if r.get("kind") == "fidelity" and "reply_tokens" in r]
    exact = {r["id"]: r for r in lines if r["setting"] == EXACT}
    shown = {r["id"]: r for r in lines if r["setting"] == setting and r["id"] in exact}
    done = {r["id"] for r in load_results(Path(out)) if r.get("kind") == "check" and r["setting"] == setting}
    engine = open_engine(SimpleNamespace(model=None, ctx=32768, threads=2))
    for doc in long_set(half):
        pairs = {q.id: (exact[q.id], shown[q.id]) for q in doc.questions if q.id in shown and q.id not in done}
        if pairs:
            score_document(engine, doc, pairs, Path(out))
            print(f"{doc.name}: {len(pairs)} scored", flush=True)
    print(summary([r for r in load_results(Path(out)) if r.get("kind") == "check" and r["setting"] == setting]))


if __name__ == "__main__":
    main(*sys.argv[1:])
