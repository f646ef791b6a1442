"""A question set's recall lines paired: exact against another mode, item by item, rescored by
`answer_found` (backend/recall/scoring.py); the lab's `recall --haystack realqa` prints it
(lab/evals/report.py: questions_text)."""
from __future__ import annotations

from backend.recall.document_questions import QUESTION_SETS, load_questions
from backend.recall.scoring import answer_found
from backend.recall.stats import paired_table
from lab.evals.compare import recall_records

# depth buckets of the report: where in the prompt the answer starts
DEPTHS = (("beginning", 1 / 3), ("middle", 2 / 3), ("end", 1.0))


def rescored(records: list[dict]) -> list[dict]:
    """Recall lines of question items scored by `answer_found` (recall's own scorer reads 7-digit values);
    other lines as they are."""
    out = []
    for r in records:
        if r.get("haystack") in QUESTION_SETS and "reply" in r:
            found = [a for a in r["expected"] if answer_found(r["reply"], [a])]
            r = {**r, "correct": bool(found), "answer": found[0] if found else None}
        out.append(r)
    return out


def depth_bucket(depth: float) -> str:
    """Where the answer starts in the prompt: its first, middle or last third."""
    return next(name for name, top in DEPTHS if depth < top or top == DEPTHS[-1][1])


def paired_questions(records: list[dict], name: str, mode: str = "guided") -> dict:
    """Exact against `mode` on the question set `name`, paired by item and rescored by `answer_found`:
    the 2x2 table and McNemar's p overall, per document and per depth bucket; the items exact answered
    and `mode` lost (both replies, whether `mode` made the answer's rows exact, and whether the oracle
    `mode`+answer answered); and the hit rate (answers in the bulk whose rows `mode` made exact)."""
    questions = load_questions(name)
    lines = [r for r in rescored(recall_records(records)) if r.get("haystack") == name]
    exact = {r["id"]: r for r in lines if r["mode"] == "off"}
    other = {r["id"]: r for r in lines if r["mode"] == mode}
    ids = sorted(set(exact) & set(other), key=lambda i: int(i.rsplit("/", 1)[1]))
    groups: dict[tuple[str, str], list[str]] = {}
    for i in ids:
        q = questions[int(i.rsplit("/", 1)[1])]
        groups.setdefault(("document", q["document"]), []).append(i)
        groups.setdefault(("depth", depth_bucket(exact[i]["depth"])), []).append(i)

    def table(part: list[str]) -> dict:
        return paired_table([exact[i]["correct"] for i in part], [other[i]["correct"] for i in part])

    oracle = {r["id"]: r for r in lines if r["mode"] == mode + "+answer"}
    lost = [{"id": i, "question": questions[int(i.rsplit("/", 1)[1])]["question"], "answer": exact[i]["expected"][0],
             "exact": exact[i]["reply"].strip(), mode: other[i]["reply"].strip(),
             "selected": other[i].get("answer_exact"),  # None: the line has no such field
             "rescued": oracle[i]["correct"] if i in oracle else None}
            for i in ids if exact[i]["correct"] and not other[i]["correct"]]
    hits = [other[i]["answer_exact"] for i in ids if "answer_exact" in other[i] and other[i].get("region") == "bulk"]
    out = {"overall": table(ids), "document": {}, "depth": {}, "lost": lost,
           "hit_rate": {"n": len(hits), "hits": sum(hits)}}
    for (kind, key), part in groups.items():
        out[kind][key] = table(part)
    return out
