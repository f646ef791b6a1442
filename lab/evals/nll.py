"""ΔNLL: mean negative log-likelihood of the last tokens of long documents, a mode minus `off`,
paired per document, with a bootstrap CI.

The document's head is prefilled in the mode under test (RidgeFill approximates its bulk rows; its last
T rows run exact) and the scored tokens always run exact on top of that cache, so the figure measures
what the approximated cache does to everything that reads it afterwards. Lines are appended to a JSON
lines file as documents finish; a rerun skips what is there (the exact side is shared by every split).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from backend.corpus import corpus_texts
from backend.reply_score import score_after_head
from backend.errors import Cancelled, DocumentError
from backend.recall.haystacks import Haystack
from backend.recall.run import append_result, load_results, result_key, reusable
from backend.recall.stats import bootstrap_ci

LAST_N = 512
CORPUS_SKIP = 1024  # tokens of each corpus text that RidgeFill's calibration reads


@dataclass
class NllDocument:
    id: str
    tokens: list[int]


@dataclass
class NllProgress:
    done: int
    total: int
    record: dict | None


def nll_documents(engine, length: int, n_docs: int, haystack: Haystack | None = None) -> list[NllDocument]:
    """`n_docs` documents of exactly `length` tokens (BOS first).

    From the shipped corpus (default), document i is corpus text i from its token CORPUS_SKIP on, the
    following texts continuing it: RidgeFill's calibration reads the first 1,024 tokens of each text, so
    the approximated rows are mostly text the maps were not fitted on. From a haystack (a user's file),
    windows start at evenly spaced offsets, cycling the text if it is short."""
    if length < LAST_N + 64:
        raise DocumentError(f"documents of {length} tokens are too short to score the last {LAST_N}")
    engine.check_fits(length, 1)
    bos = engine.tokenize("", add_special=True)
    if haystack is None or haystack.name == "corpus":
        texts = [t.strip() for t in corpus_texts() if t.strip()]
        if not texts:
            raise DocumentError("The shipped prose corpus is missing; give documents with --doc FILE.")
        docs = []
        for i in range(n_docs):
            k = i % len(texts)
            order = texts[k:] + texts[:k]
            toks = engine.tokenize("\n\n".join(order), add_special=False)
            skip = min(CORPUS_SKIP, len(engine.tokenize(order[0], add_special=False)) // 2)
            toks = toks[skip:]
            while len(toks) < length:  # cycle if the whole corpus is shorter than one document
                toks = toks + engine.tokenize("\n\n" + "\n\n".join(order), add_special=False)
            docs.append(NllDocument(f"corpus-{k}-{i // len(texts)}-L{length}", (bos + toks)[:length]))
        return docs
    toks = engine.tokenize(haystack.text, add_special=False)
    if not toks:
        raise DocumentError(f"{haystack.name} has no text to score")
    while len(toks) < length + n_docs:
        toks = toks + engine.tokenize("\n\n" + haystack.text, add_special=False)
    stride = (len(toks) - length) // (n_docs - 1) if n_docs > 1 else 0
    return [NllDocument(f"{haystack.name}-{i}-L{length}", (bos + toks[i * stride:])[:length]) for i in range(n_docs)]


def token_logprobs(engine, tokens: list[int], last_n: int, *, prefill=None,
                   cancel: Callable[[], bool] | None = None) -> np.ndarray:
    """log p(token | everything before it) for each of the last `last_n` tokens (the exact model
    unless `prefill(tokens_head, cancel=...)` is given to run the head another way).

    The head tokens[:-last_n] is prefilled without reuse, on an empty cache; the scored tokens run
    exact with logits for every row. The cache is empty afterwards (scratch): no request reuses them."""
    if not 0 < last_n < len(tokens):
        raise ValueError("last_n must be between 1 and len(tokens) - 1")
    head = tokens[:-last_n]
    engine.make_room(len(tokens), 1)
    with engine.scratch():
        engine.slot.truncate(0)  # whatever the cache held, the head starts at position 0
        if prefill is None:
            engine.slot.prefill(head, reuse_prefix=False, cancel=cancel)
        else:
            prefill(head, cancel=cancel)
        return score_after_head(engine, tokens[-last_n:], len(head), cancel)


def _report_fields(report) -> dict:
    d = asdict(report) if is_dataclass(report) else dict(vars(report))
    return {"mode_run": d.get("mode"), "bulk_n": d.get("bulk_n", 0), "note": d.get("note", "")}


def document_nll(engine, doc: NllDocument, mode: str, split: int | None, tail: int | None,
                 last_n: int = LAST_N, cancel: Callable[[], bool] | None = None) -> dict:
    """One result line: the mean NLL (nats/token) of the document's last `last_n` tokens in `mode`."""
    t0 = time.perf_counter()
    info = {"mode_run": "off", "bulk_n": 0, "note": ""}
    prefill = None
    if mode != "off":
        from backend.ridgefill.plan import ridgefill_prefill

        def prefill(head, cancel=None):
            info.update(_report_fields(ridgefill_prefill(engine, head, mode, split, tail, cancel=cancel)))

    lp = token_logprobs(engine, doc.tokens, last_n, prefill=prefill, cancel=cancel)
    return {"kind": "nll", "id": doc.id, "mode": mode, "split": split if mode != "off" else None, "tail": tail,
            "length": len(doc.tokens), "last_n": last_n, "nll": float(-lp.mean()), **info,
            "seconds": round(time.perf_counter() - t0, 2)}


def run_nll(engine, docs: list[NllDocument], mode: str, split: int | None, tail: int | None, out_path: str | Path,
            last_n: int = LAST_N, on_progress: Callable[[NllProgress], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> dict:
    """Score every document exact and in `mode` (document by document; resumes from `out_path`) and
    return the paired summary (see `summarize_nll`)."""
    out = Path(out_path)
    done = {result_key(r): r for r in load_results(out)
            if r.get("kind") == "nll" and r.get("last_n") == last_n and reusable(r)}
    total, n = 2 * len(docs), 0
    lines = []
    for doc in docs:
        for m in ("off", mode):
            key = result_key({"id": doc.id, "mode": m, "split": split, "tail": tail})
            rec = done.get(key)
            if rec is None:
                if cancel is not None and cancel():
                    raise Cancelled(f"NLL run cancelled after {n} of {total} runs; rerun to resume")
                rec = document_nll(engine, doc, m, split, tail, last_n, cancel)
                append_result(out, rec)
                done[key] = rec
            n += 1
            if on_progress is not None:
                on_progress(NllProgress(n, total, rec))
            lines.append(rec)
    return summarize_nll(lines, mode, split, tail)


def summarize_nll(lines: list[dict], mode: str, split: int | None, tail: int | None, level: float = 0.95) -> dict:
    """Paired per document: Δ = NLL(mode) - NLL(off); mean Δ with a percentile bootstrap CI."""
    off = {r["id"]: r for r in lines if r["mode"] == "off"}
    other = {r["id"]: r for r in lines if r["mode"] == mode and r.get("split") == split and r.get("tail") == tail}
    ids = [i for i in other if i in off]
    deltas = [other[i]["nll"] - off[i]["nll"] for i in ids]
    out = {"mode": mode, "split": split, "tail": tail, "n_docs": len(ids),
           "approximated": sum(1 for i in ids if other[i].get("bulk_n", 0) > 0),
           "notes": sorted({other[i]["note"] for i in ids if other[i].get("note")}),
           "docs": [{"id": i, "length": off[i]["length"], "nll_off": off[i]["nll"], "nll": other[i]["nll"],
                     "delta": d, "bulk_n": other[i].get("bulk_n", 0)} for i, d in zip(ids, deltas)]}
    if ids:
        lo, hi = bootstrap_ci(deltas, level=level)
        out.update(nll_off=float(np.mean([off[i]["nll"] for i in ids])), nll=float(np.mean([other[i]["nll"] for i in ids])),
                   delta=float(np.mean(deltas)), ci_lo=lo, ci_hi=hi, level=level)
    return out
