"""Questions about real documents (backend/data/questions), as items the needle evals can run.

Each question is one chat prompt made as the app makes it (document_messages), and its answer phrase is
the one "needle": the prompt rows it covers are found as the needles' are (token_spans), so the hit rate
(lab/evals/selection.py) checks those rows, and recall checks the reply for the phrase. The licence texts are
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

QUESTION_SETS = ("licences", "realqa")


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

