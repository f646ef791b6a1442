"""Questions about real documents (backend/data/questions), as items the needle evals can run.

Each question is one chat prompt made as the app makes it (document_messages), and its answer phrase is
the one "needle": the prompt rows it covers are found as the needles' are (token_spans), so the hit rate
(evals.selection) checks those rows, and recall checks the reply for the phrase. The licence texts are
long, hard-wrapped legal prose whose answers are ordinary words in ordinary sentences: what the needle
haystacks do not have. `realqa` asks short factual questions about READMEs and FAQs of Debian packages,
texts the embedded model can answer from; a reply is right when it holds one of the accepted forms
(`answer_found`), the same rule for every mode.
"""
from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from ..documents import document_messages
from ..protocol import CompletionRequest
from .needles import Needle, NeedleError, NeedleItem, token_spans
from .scoring import answer_found

QUESTION_SETS = ("licences", "realqa")
# depth buckets of the report: where in the prompt the answer starts
DEPTHS = (("beginning", 1 / 3), ("middle", 2 / 3), ("end", 1.0))


def questions_dir() -> Path:
    return Path(str(files("backend").joinpath("data", "questions")))


def load_questions(name: str) -> list[dict]:
    """The questions of the set `name`, in file order."""
    if name not in QUESTION_SETS:
        raise NeedleError(f"unknown question set {name!r}; choose from {', '.join(QUESTION_SETS)}")
    return json.loads((questions_dir() / f"{name}.json").read_text(encoding="utf-8"))


def accepted(q: dict) -> list[str]:
    """The answer phrase of the text first, then any other accepted form of it."""
    return [q["answer"], *q.get("accept", [])]


def question_items(engine, name: str = "licences") -> list[NeedleItem]:
    """One item per question of the set `name`, in file order."""
    items = []
    for i, q in enumerate(load_questions(name)):
        document = (questions_dir() / q["document"]).read_text(encoding="utf-8")
        messages = document_messages(document, q["question"])
        tokens = engine.prompt_tokens(CompletionRequest(messages=messages))
        start, end = answer_rows(engine, messages, tokens, q["answer"], q.get("after"))
        # the hit rate wants every row from the needle's key on: here the answer's first piece
        needle = Needle(key=engine.token_text(tokens[start]).strip(), value=q["answer"], start=start, end=end,
                        asked=True)
        items.append(NeedleItem(
            id=f"{name}/{i:02d}", variant="question", length=len(tokens), depth=round(start / len(tokens), 3),
            haystack=name, seed=0, rep=0, key=q["answer"], answers=accepted(q), needles=[needle],
            messages=messages, max_tokens=32, document=q["document"]))
    return items


def answer_rows(engine, messages, tokens: list[int], answer: str, after: str | None = None) -> tuple[int, int]:
    """The prompt rows [start, end) that hold `answer` (its first occurrence after `after`)."""
    text = engine.format_chat(messages)
    at = text.find(answer, text.find(after) if after else 0)
    if at < 0 or (after and text.find(after) < 0):
        raise NeedleError(f"the answer {answer!r} is not in the prompt")
    return token_spans(engine, text, tokens, [(at, at + len(answer))])[0]


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
    from .compare import recall_records
    from .stats import paired_table

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
