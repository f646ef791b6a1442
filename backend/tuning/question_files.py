"""Questions about whole documents, as `fidelity` and `tune` read them: the shipped long set
(backend/data/questions/long: one NAME.txt and its NAME.json per document) or a user's own document and
question list.

A question file is a JSON list of {"question", "answer" (optional), "accept", "after", "wrong"
(optional)}: `answer` and `accept` are the forms that count as right, `wrong` the rival values whose
mention in the reply's first sentence makes a claim wrong (backend/recall/scoring.claim_right).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DocumentError
from ..recall.document_questions import questions_dir

LONG_SET = "long"
# The half of the long set whose documents choose defaults and splits; the other half judges them
# (the set's README says which document is in which, and why).
CHOOSE, JUDGE = "choose", "judge"
_KEYS = {"question", "answer", "accept", "after", "wrong"}


@dataclass
class DocumentQuestion:
    id: str  # "DOCUMENT/NN"
    document: str  # the document's name
    question: str
    answers: list[str] = field(default_factory=list)  # right forms; empty: no answer given
    wrong: list[str] = field(default_factory=list)
    after: str | None = None  # the answer's place: its first occurrence after this text


@dataclass
class QuestionedDocument:
    name: str
    text: str
    questions: list[DocumentQuestion]
    half: str | None = None  # CHOOSE or JUDGE for the long set's documents


def long_set_dir() -> Path:
    return questions_dir() / LONG_SET


def parse_questions(raw: object, document: str) -> list[DocumentQuestion]:
    """The questions of a question file's parsed JSON; DocumentError saying which entry is wrong."""
    if not isinstance(raw, list) or not raw:
        raise DocumentError(f"questions for {document}: expected a non-empty JSON list of {{\"question\": ...}}")
    out = []
    for i, q in enumerate(raw):
        if not isinstance(q, dict) or not isinstance(q.get("question"), str) or not q["question"].strip():
            raise DocumentError(f"questions for {document}, entry {i}: needs a \"question\" string")
        extra = sorted(set(q) - _KEYS)
        if extra:
            raise DocumentError(f"questions for {document}, entry {i}: unknown keys {', '.join(extra)}")
        lists = [q.get(key) or [] for key in ("accept", "wrong")]
        if not all(isinstance(x, list) for x in lists):
            raise DocumentError(f"questions for {document}, entry {i}: \"accept\" and \"wrong\" are lists of strings")
        forms = ([q["answer"]] if q.get("answer") is not None else []) + lists[0]
        wrong = lists[1]
        if not all(isinstance(a, str) and a.strip() for a in forms + wrong):
            raise DocumentError(f"questions for {document}, entry {i}: answers must be non-empty strings")
        after = q.get("after") if isinstance(q.get("after"), str) else None
        out.append(DocumentQuestion(f"{document}/{i:02d}", document, q["question"].strip(), forms, wrong, after))
    return out


def read_question_file(path: str | Path, document: str) -> list[DocumentQuestion]:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DocumentError(f"cannot read the question file {p.name}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DocumentError(f"the question file {p.name} is not JSON: {exc}") from None
    return parse_questions(raw, document)


def long_set(half: str | None = None) -> list[QuestionedDocument]:
    """The long set's documents with their questions, by name; `half`: only that half's."""
    folder = long_set_dir()
    halves = json.loads((folder / "halves.json").read_text(encoding="utf-8"))
    docs = []
    for q_path in sorted(folder.glob("*.json")):
        if q_path.name == "halves.json":
            continue
        name = q_path.stem + ".txt"
        doc_half = halves.get(name)
        if half is not None and doc_half != half:
            continue
        text = (folder / name).read_text(encoding="utf-8")
        docs.append(QuestionedDocument(name, text, read_question_file(q_path, name), doc_half))
    return docs
