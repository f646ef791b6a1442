"""Sources precision: does the answer's top source, or any of its three, hold the asked fact's sentence?

Each item (a needle item, or a question about a real document) runs through `complete` with its
document attached, in each mode; a source holds the fact when its character span covers the asked
needle's sentence ("The special magic number for KEY is VALUE.") or the question's answer phrase where
the document says it. In the same run the sources are found a second time without the contrast question
(`*_plain`), so the two rankings are compared on the same cache. One JSON line per (item, mode), appended
as it finishes: an interrupted run resumes (the recall runner's file rules).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from backend.completion import complete
from backend.documents import DocumentText
from backend.errors import Cancelled
from backend.recall.document_questions import QUESTION_SETS, load_questions, questions_dir
from backend.recall.needles import INTRO, NEEDLE, NeedleError, NeedleItem
from backend.recall.run import SharedDocuments, append_result, load_results, result_key
from backend.recall.scoring import answer_found, score
from backend.sources import answer_sources


def item_document(item: NeedleItem) -> tuple[DocumentText, list[tuple[int, int]]]:
    """The item's document as attached, and the character spans of its asked facts in that text."""
    if item.haystack in QUESTION_SETS:
        q = load_questions(item.haystack)[int(item.id.rsplit("/", 1)[1])]
        text = (questions_dir() / q["document"]).read_text(encoding="utf-8")
        at = text.find(q["answer"], text.find(q["after"]) if q.get("after") else 0)
        return DocumentText(q["document"], text), [(at, at + len(q["answer"]))]
    content = item.messages[0].content
    # the haystack with its needles: the instruction before it and the question after it are the frame,
    # as "Read this document." and the question are for a document
    body = content.rsplit("\n\n", 1)[0].removeprefix(INTRO).lstrip()
    kind = "uuid" if item.variant == "uuid" else "number"
    spans = []
    for nd in item.asked:
        sentence = NEEDLE[kind].format(key=nd.key, value=nd.value)
        at = body.find(sentence)
        if at < 0:
            raise NeedleError(f"item {item.id}: the needle {sentence!r} is not in its text")
        spans.append((at, at + len(sentence)))
    return DocumentText(item.haystack, body), spans


def holds(source: dict, spans: list[tuple[int, int]]) -> bool:
    """Whether the source's span covers one of the asked facts whole."""
    return any(source["start"] <= a and b <= source["end"] for a, b in spans)


def run_item(engine, item: NeedleItem, mode: str, split: int | None, tail: int | None,
             cancel: Callable[[], bool] | None = None, shared: SharedDocuments | None = None) -> dict:
    """One item in one mode. `shared`: questions about one document restore its rows' prefill (the same
    answer and sources; ttft_ms is then not a prefill time, and the line says so in shared_rows)."""
    doc, spans = item_document(item)
    request = item.request(mode, split, tail)
    request.documents = [doc]
    t0 = time.perf_counter()
    shared_n = shared.rows(item) if shared is not None else 0
    if shared is not None:
        result = shared.complete(item, request, cancel)
    else:
        result = complete(engine, request, cancel=cancel)
    if result.finish_reason == "cancelled":
        raise Cancelled(f"item {item.id} cancelled while answering")
    found = [s.as_dict() for s in result.sources]
    tokens = engine.prompt_tokens(request)
    plain, _ = answer_sources(engine, tokens, [doc], contrast=False)
    plain = [s.as_dict() for s in plain]
    t = result.timings
    correct = answer_found(result.text, item.answers) if item.haystack in QUESTION_SETS else \
        score(result.text, item.answers, "uuid" if item.variant == "uuid" else "number")[0]
    return {
        "kind": "sources", "id": item.id, "variant": item.variant, "length": item.length, "depth": item.depth,
        "haystack": item.haystack, "mode": mode, "split": split if mode != "off" else None, "tail": tail,
        "mode_run": t.mode, "note": t.note, "facts": spans, "correct": bool(correct), "reply": result.text,
        "top": bool(found) and holds(found[0], spans), "any": any(holds(s, spans) for s in found),
        "top_plain": bool(plain) and holds(plain[0], spans), "any_plain": any(holds(s, spans) for s in plain),
        "sources": found, "ttft_ms": round(t.ttft_ms, 1), "prompt_ms": round(t.prompt_ms, 1),
        "sources_ms": round(t.sources_ms, 1), "seconds": round(time.perf_counter() - t0, 2),
        "shared_rows": shared_n,
    }


def run_sources(engine, items: list[NeedleItem], modes: list[str], split: int | None, tail: int | None,
                out_path: str | Path, on_record: Callable[[int, int, dict | None], None] | None = None,
                cancel: Callable[[], bool] | None = None, share_documents: bool = True) -> list[dict]:
    """Every item in every mode (item by item); lines already in `out_path` are not run again.
    `share_documents`: questions about one document restore its prefill (recall.SharedDocuments)."""
    out = Path(out_path)
    shared = SharedDocuments(engine, items, tail) if share_documents else None
    done = {result_key(r): r for r in load_results(out) if r.get("kind") == "sources"}
    results, total = [], len(items) * len(modes)
    for item in items:
        for mode in modes:
            rec = done.get(result_key({"id": item.id, "mode": mode, "split": split, "tail": tail}))
            fresh = rec is None
            if fresh:
                if cancel is not None and cancel():
                    raise Cancelled(f"sources run cancelled after {len(results)} of {total}; rerun to resume")
                rec = run_item(engine, item, mode, split, tail, cancel, shared)
                append_result(out, rec)
            results.append(rec)
            if on_record is not None:
                on_record(len(results), total, rec if fresh else None)
    return results


def depth_bucket(depth: float) -> str:
    return f"{depth:.2f}"


def precision_table(records: list[dict]) -> list[dict]:
    """Per mode, overall and per haystack, length and depth: top and any-of-3 hits (with and without the
    contrast question), and the sources' cost against the TTFT."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        keys = [("all", ""), ("haystack", r["haystack"])]
        if r["haystack"] not in QUESTION_SETS:  # a question's length and depth are its document's
            keys += [("length", str(r["length"])), ("depth", depth_bucket(r["depth"]))]
        for k in keys:
            groups.setdefault((r["mode"],) + k, []).append(r)
    rows = []
    for (mode, kind, value), rs in sorted(groups.items()):
        n = len(rs)
        timed = [r for r in rs if not r.get("shared_rows")]  # a restored prefill's TTFT is no prefill time
        rows.append({"mode": mode, "group": kind if not value else f"{kind} {value}", "n": n,
                     "top": sum(r["top"] for r in rs), "any": sum(r["any"] for r in rs),
                     "top_plain": sum(r["top_plain"] for r in rs), "any_plain": sum(r["any_plain"] for r in rs),
                     "sources_ms": round(sum(r["sources_ms"] for r in rs) / n, 1),
                     "ttft_ms": round(sum(r["ttft_ms"] for r in timed) / len(timed), 1) if timed else None})
    return rows

