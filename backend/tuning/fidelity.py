"""Fidelity to exact: how far a mode moves the exact model's own reply to a question about a document.

For each question the exact model answers first (greedy). Every other setting then answers the same
prompt, and exact's reply is teacher-forced on top of that setting's cache: the reply's mean negative
log-likelihood there minus under exact's own cache is the item's ΔNLL (nats per reply token). Right or
wrong, a reply a mode leaves likely is a reply it keeps; on small models, whose answers are mostly
wrong, this says what accuracy alone cannot. The yardstick is llama.cpp's q8_0 K/V cache (`q8`), lossy
and in everyday use; `mb128` (exact at micro-batch 128) is rounding alone.

Each document's shared rows are prefilled once per setting and restored for each question
(prefix_snapshot.py). Lines go to a JSON lines file as they finish; a rerun resumes it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable


from ..completion import complete
from ..documents import document_messages
from ..errors import Cancelled, DocumentError, DocumentTooLongError
from ..protocol import N_BATCH, RIDGEFILL_MODES, CompletionRequest
from ..reply_score import reply_nll
from ..recall.prefix_snapshot import PrefixSnapshots, shared_rows
from ..recall.run import append_result, load_results
from ..recall.scoring import answer_found, claim_right
from ..ridgefill.defaults import tail_or_default
from .question_files import QuestionedDocument

MAX_TOKENS = 32  # a short answer's room; the same for every setting
EXACT = "off"


@dataclass(frozen=True)
class Setting:
    """One way to answer: a mode (and split) on an engine whose K/V type and micro-batch it names."""
    name: str  # as asked: off, guided, guided:7, speed, q8, mb128
    mode: str
    split: int | None = None
    kv_type: str = "f16"
    ubatch: int = N_BATCH
    window_bulk: bool | None = None  # guided:6w: the bulk's attention below the split windowed

    @property
    def engine_key(self) -> tuple[str, int]:
        return self.kv_type, self.ubatch


def parse_setting(text: str) -> Setting:
    """off | q8 | mb128 | MODE[:SPLIT[w]] for a RidgeFill mode (w: windowed bulk attention);
    DocumentError for anything else."""
    name, _, split = text.strip().partition(":")
    if name in ("off", "exact") and not split:
        return Setting(EXACT, EXACT)
    if name == "q8" and not split:
        return Setting("q8", EXACT, kv_type="q8_0")
    if name == "mb128" and not split:
        return Setting("mb128", EXACT, ubatch=128)
    windowed = split.endswith("w")
    split = split.removesuffix("w")
    if name in RIDGEFILL_MODES and name != "plumb" and (not split or split.isdigit()):
        return Setting(text.strip(), name, int(split) if split else None, window_bulk=windowed or None)
    raise DocumentError(f"unknown setting {text!r}: use off, q8, mb128, or a mode (guided, speed, quality) "
                        "with an optional :SPLIT")


def item_request(doc: QuestionedDocument, question: str, setting: Setting) -> CompletionRequest:
    return CompletionRequest(messages=document_messages(doc.text, question), max_tokens=MAX_TOKENS,
                             mode=setting.mode, split=setting.split, window_bulk=setting.window_bulk)


def score_fields(reply: str, q) -> dict:
    if not q.answers:
        return {"right": None, "mention": None}
    return {"right": claim_right(reply, q.answers, q.wrong), "mention": answer_found(reply, q.answers)}


class FidelityRun:
    """Every question of `docs` in every setting, document by document, exact first."""

    def __init__(self, engine_for: Callable[[Setting], object], model: str, out_path: str | Path,
                 tail: int | None = None, on_line: Callable[[dict], None] | None = None,
                 cancel: Callable[[], bool] | None = None, plan_for: Callable | None = None):
        self.engine_for, self.model, self.out = engine_for, model, Path(out_path)
        self.tail, self.on_line, self.cancel = tail, on_line, cancel
        self.plan_for = plan_for  # (engine, request, n_tokens) -> the plan a RidgeFill setting runs; None: the app's
        self.done = {(r["model"], r["id"], r["setting"]): r for r in load_results(self.out)
                     if r.get("kind") == "fidelity"}

    def run(self, docs: list[QuestionedDocument], settings: list[Setting]) -> list[dict]:
        order = [s for s in settings if s.name == EXACT] or [parse_setting(EXACT)]
        order += [s for s in settings if s.name != EXACT]
        for doc in docs:
            for setting in order:
                self.document(doc, setting)
        questions = {q.id: q for d in docs for q in d.questions}
        names = {s.name for s in order}
        # scored again by today's rule: a line keeps the reply, not the verdict
        return [{**r, **score_fields(r["reply"], questions[i])} if "reply" in r else r
                for (m, i, s), r in self.done.items() if m == self.model and i in questions and s in names]

    def document(self, doc: QuestionedDocument, setting: Setting) -> None:
        """`doc`'s questions not yet answered in `setting` (exact's before any other's: the reference)."""
        todo = [q for q in doc.questions if (self.model, q.id, setting.name) not in self.done]
        if not todo:
            return
        engine = self.engine_for(setting)
        requests = [item_request(doc, q.question, setting) for q in doc.questions]
        prompts = [engine.prompt_tokens(r) for r in requests]
        try:
            engine.check_fits(max(len(p) for p in prompts), MAX_TOKENS)
        except DocumentTooLongError as exc:
            for q in todo:
                self._keep(self._line(doc, q, setting, {"skipped": str(exc).splitlines()[0]}))
            return
        # exact's rows are exact wherever they fall: it shares the document's rows up to its end
        tail = 0 if setting.mode == EXACT else tail_or_default(engine.info, self.tail)
        shared_n = shared_rows(engine, prompts, tail) if len(prompts) > 1 else 0
        snapshots = PrefixSnapshots(engine)
        with engine.scratch():
            for q in todo:
                if self.cancel is not None and self.cancel():
                    raise Cancelled("fidelity run cancelled; rerun the same command to resume")
                request = replace(requests[doc.questions.index(q)], tail=self.tail)
                self._keep(self._line(doc, q, setting, self._answer(engine, snapshots, request, shared_n, q)))

    def _answer(self, engine, snapshots, request, shared_n: int, q) -> dict:
        t0 = time.perf_counter()
        prompt = engine.prompt_tokens(request)
        plan = None
        if self.plan_for is not None and shared_n:  # a variant is the shared rows' (their snapshot's) only
            engine.make_room(len(prompt), request.max_tokens)  # planned for the context it runs in
            plan = self.plan_for(engine, request, len(prompt))
        result = (snapshots.complete(request, shared_n, plan=plan) if shared_n
                  else complete(engine, replace(request, reuse_prefix=False), plan=plan))
        exact = self.done.get((self.model, q.id, EXACT))
        reference = exact["reply_tokens"] if exact and "reply_tokens" in exact else list(result.tokens)
        t = result.timings
        # the shared rows' prefill (the first question of a document) and this question's own: its TTFT
        ttft_s = (snapshots.prefill_s if shared_n else 0.0) + t.ttft_ms / 1000
        return {"mode_run": t.mode, "split": t.split, "tail": t.tail, "prompt_n": len(prompt), "ttft_s": round(ttft_s, 3),
                "shared_rows": shared_n, "bulk_n": t.bulk_n, "exact_n": t.exact_n, "note": t.note,
                "reply": result.text, "reply_tokens": list(result.tokens), "finish": result.finish_reason,
                "nll_ref": reply_nll(engine, prompt, reference), "ref_n": len(reference),
                **score_fields(result.text, q), "seconds": round(time.perf_counter() - t0, 2)}

    def _line(self, doc: QuestionedDocument, q, setting: Setting, fields: dict) -> dict:
        return {"kind": "fidelity", "model": self.model, "id": q.id, "document": doc.name, "half": doc.half,
                "setting": setting.name, "mode": setting.mode, "question": q.question, "answers": q.answers,
                **fields}  # "mode": load_results reads lines that have one

    def _keep(self, line: dict) -> None:
        append_result(self.out, line)
        self.done[(line["model"], line["id"], line["setting"])] = line
        if self.on_line is not None:
            self.on_line(line)
