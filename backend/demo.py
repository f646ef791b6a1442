"""The headless demo: a real document the app ships whole and one question about it, scored on its claim.

The document is Valgrind's FAQ from the long real-question set (GPL-2.0+ / GFDL-1.2+, Valgrind 3.19.0;
backend/data/questions/long/README.md records its licence): 5,400 tokens on Gemma 3. The question is
one the default model answers right in both modes on the set's judge half (docs/LONG_DOCUMENTS.md).
A shorter demo (`--tokens`) keeps a window of whole paragraphs around the answer.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources

from .recall.scoring import claim_right

DEMO_SOURCE = "valgrind-faq"  # backend/data/questions/long/<DEMO_SOURCE>.txt and .json
DEMO_INDEX = 12  # the question's place in the document's question list
FOLLOW_UP = "What e-mail address should you write to if an answer in the Valgrind FAQ is incomplete or inaccurate?"
ANSWER_DEPTH = 0.3  # where the answer sits in a window cut shorter than the document


@dataclass(frozen=True)
class DemoQuestion:
    question: str
    answers: tuple[str, ...]  # the right forms
    wrong: tuple[str, ...]  # rival values that make a reply wrong


@dataclass
class DemoDocument:
    name: str
    text: str
    n_tokens: int  # of the document alone, with the model's tokenizer
    answer_depth: float  # where the answer's paragraph sits, as a share of the text


@functools.cache  # read once: the demo document, its scoring and the command each ask for it
def demo_question() -> DemoQuestion:
    entry = json.loads(_long_set().joinpath(f"{DEMO_SOURCE}.json").read_text(encoding="utf-8"))[DEMO_INDEX]
    return DemoQuestion(entry["question"], (entry["answer"], *entry.get("accept", [])), tuple(entry.get("wrong", [])))


def demo_right(reply: str) -> bool:
    """Whether the reply's first sentence claims the answer (a mention inside a wrong claim is wrong)."""
    q = demo_question()
    return claim_right(reply, q.answers, q.wrong)


def demo_text() -> str:
    """The demo document, whole."""
    return _long_set().joinpath(f"{DEMO_SOURCE}.txt").read_text(encoding="utf-8")


def demo_document(tokenize, n_tokens: int | None = None) -> DemoDocument:
    """The whole document, or whole paragraphs of it around the answer's within about n_tokens."""
    text = demo_text()
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    answer_at = next(i for i, p in enumerate(paragraphs) if demo_question().answers[0] in p)
    if n_tokens is not None and len(tokenize(text)) > n_tokens:
        paragraphs, answer_at = _window(paragraphs, answer_at, tokenize, n_tokens)
    text = "\n\n".join(paragraphs)
    return DemoDocument(f"{DEMO_SOURCE}.txt", text, len(tokenize(text)), answer_at / len(paragraphs))


def _window(paragraphs: list[str], answer_at: int, tokenize, n_tokens: int) -> tuple[list[str], int]:
    """The paragraphs around `answer_at` (about ANSWER_DEPTH of them before it) within n_tokens."""
    cost = [len(tokenize(p + "\n\n")) for p in paragraphs]
    lo = hi = answer_at
    total = cost[answer_at]
    while True:
        before = lo > 0 and (hi + 1 >= len(paragraphs) or (answer_at - lo) < ANSWER_DEPTH * (hi - lo + 1))
        grow = lo - 1 if before else hi + 1
        if grow >= len(paragraphs) or total + cost[grow] > n_tokens:
            break
        lo, hi, total = min(lo, grow), max(hi, grow), total + cost[grow]
    return paragraphs[lo:hi + 1], answer_at - lo


def _long_set():
    return resources.files("backend").joinpath("data", "questions", "long")
