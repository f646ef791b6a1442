"""The calibration text: the shipped prose and technical texts (or texts given instead) and, for each text, a
chat-formatted copy rendered with the model's own template, as token sequences ready to capture."""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from backend.corpus import calibration_files
from backend.documents import document_messages
from backend.protocol import ChatMessage, CompletionRequest

# Questions for the chat copies: the app's use is "a document, then a question about it".
_QUESTIONS = (
    "Summarise this text in two sentences.",
    "What is the main subject of this document?",
    "List the key facts mentioned above.",
    "Who or what is this text about, and what happens?",
)


class CalibrationSequence(NamedTuple):
    doc: int  # the text it came from (held-out rows are chosen by document)
    kind: str  # "prose" | "chat"
    tokens: list[int]


@dataclass(frozen=True)
class CalibrationTexts:
    texts: list[str]
    digest: str  # a short hash of the texts (recorded with the capture)
    source: list[str]  # the corpus file names, or ["(given texts)"]


def calibration_texts(texts: list[str] | None = None) -> CalibrationTexts:
    """The shipped calibration text (prose and technical), or `texts` when given; ValueError when there
    is no text."""
    if texts is None:
        files = calibration_files()
        found = CalibrationTexts([p.read_text(encoding="utf-8") for p in files], corpus_digest(files),
                                 [p.name for p in files])
    else:
        found = CalibrationTexts(texts, hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16], ["(given texts)"])
    if not found.texts:
        raise ValueError("no calibration text")
    return found


def corpus_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _first_sentences(text: str, n: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return " ".join(parts[1 : 1 + n]) or parts[0]  # skip a title-like first line


def calibration_sequences(engine, texts: list[str], max_seq: int) -> list[CalibrationSequence]:
    """(document id, "prose"|"chat", tokens) for each text and its chat copy, each cut to max_seq."""
    seqs = []
    for i, text in enumerate(texts):
        prose = engine.tokenize(text)
        seqs.append(CalibrationSequence(i, "prose", prose[:max_seq]))
        # The app's own document prompt (the text cut to leave room for the turns), plus a short
        # answer so assistant turns are seen too.
        room = max(16, max_seq - 160)
        doc = engine.detokenize(prose[:room]) if len(prose) > room else text
        messages = document_messages(doc, _QUESTIONS[i % len(_QUESTIONS)])
        messages.append(ChatMessage("assistant", _first_sentences(text, 2)[:300]))
        seqs.append(CalibrationSequence(i, "chat", engine.prompt_tokens(CompletionRequest(messages=messages))[:max_seq]))
    return seqs


def within_budget(seqs: list[CalibrationSequence], max_tokens: int | None) -> list[CalibrationSequence]:
    """The sequences in order, the last one cut, until `max_tokens` are spent (None: all); empty ones
    dropped. The list alternates prose and chat copies, so a budget takes both."""
    if max_tokens is not None:
        kept, left = [], max_tokens
        for seq in seqs:
            if left <= 0:
                break
            kept.append(seq._replace(tokens=seq.tokens[:left]))
            left -= len(kept[-1].tokens)
        seqs = kept
    return [s for s in seqs if s.tokens]
