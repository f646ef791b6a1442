"""The items tune judges a split on: needles in the approximated bulk, and a fixed subset of real questions.

Needles (backend/recall/needles.py) tell whether the maps keep a planted fact; real questions (the
`realqa` set, backend/recall/document_questions.py) tell whether guided answers what exact answers about
real documents, where needles held and real answers were lost (docs/measurements/real-questions.md#real-questions-about-real-documents).
The real subset is the same for every model and every run: `per_part` questions of each of the sixteen
document parts, spread over the part (its questions are in text order), the questions of one part next
to each other so that the recall runner prefills each part once per mode (`share_documents`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import RidgeFillError
from ..recall.document_questions import load_questions, question_items
from ..recall.haystacks import load_haystack
from ..recall.needles import NeedleItem, make_items
from ..recall.run import effective_tail

REAL_SET = "realqa"
# Two a part: 32 questions, of which SmolLM2 answers about 7 from the exact prompt (21% of the set); each
# part's prefill is shared by its two questions, so exact takes about 3 minutes on 2 threads.
REAL_PER_PART = 2


def bulk_items(engine, length: int, depths, variants, haystacks, tail: int,
               max_answer_tokens: int | None) -> list[NeedleItem]:
    """The needle items of every haystack whose asked needle lies in the approximated bulk at `tail`."""
    items = [it for name in haystacks for it in make_items(engine, lengths=[length], depths=list(depths),
                                                            variants=list(variants), haystack=load_haystack(name))]
    bulk_tail = effective_tail(engine, length, tail)
    items = [it for it in items if it.region(bulk_tail) == "bulk"]
    for it in items if max_answer_tokens else ():  # tests: a 7-digit answer needs only a few tokens
        it.max_tokens = min(it.max_tokens, max_answer_tokens)
    if not items:
        raise RidgeFillError(f"no needle item lies in the approximated bulk at {length} tokens with tail {tail}; "
                             "give a longer --length.")
    return items


def real_question_ids(questions: list[dict], per_part: int) -> list[int]:
    """Indices into `questions` of `per_part` questions of every document part: the j-th at (j + 1/2) /
    per_part of the part's questions (first and last quarter for two), parts in order of first
    appearance, each part's questions together."""
    parts: dict[str, list[int]] = {}
    for i, q in enumerate(questions):
        parts.setdefault(q["document"], []).append(i)
    out = []
    for ids in parts.values():
        k = min(per_part, len(ids))
        out += [ids[int((j + 0.5) * len(ids) / k)] for j in range(k)]
    return out


def real_question_items(engine, per_part: int, tail: int, room: int) -> tuple[list[NeedleItem], list[str]]:
    """(items, parts left out): the real-question subset as recall items, without those whose prompt and
    answer pass `room` tokens or whose bulk is too short for RidgeFill to run (it would run exact)."""
    if per_part <= 0:
        return [], []
    wanted = [f"{REAL_SET}/{i:02d}" for i in real_question_ids(load_questions(REAL_SET), per_part)]
    by_id = {it.id: it for it in question_items(engine, REAL_SET)}  # ids as question_items names them
    ordered = [by_id[i] for i in wanted]
    fits = [it for it in ordered if it.length + it.max_tokens <= room
            and effective_tail(engine, it.length, tail) < it.length]
    left_out = sorted({it.document for it in ordered} - {it.document for it in fits})
    return fits, left_out


@dataclass
class RealQuestions:
    """A candidate's real questions against exact's. Only exact's right answers are judged: exact gets
    most of these questions wrong, and a wrong answer lost says nothing about the maps."""
    n: int  # items run exact
    exact_correct: int  # k: exact's right answers
    correct: int | None = None  # None (and lost, gained): not run at this split
    lost: int | None = None  # right exact, wrong at the split
    gained: int | None = None  # wrong exact, right at the split
    keeps: bool | None = None  # None: not judged (too few right exact, or not run)
    seconds: float = 0.0

    def text(self) -> str:
        """", 5/32 real questions (2 of exact's 7 lost, 0 gained)" for a note; "" when not run."""
        if self.n == 0 or self.correct is None:
            return ""
        return (f", {self.correct}/{self.n} real questions ({self.lost} of exact's {self.exact_correct} lost, "
                f"{self.gained} gained)")

    def brief(self) -> dict:
        return {"n": self.n, "exact_correct": self.exact_correct, "correct": self.correct, "lost": self.lost,
                "gained": self.gained, "keeps": self.keeps}


def real_counts(exact_right: set[str], rows: list[dict]) -> tuple[int, int, int]:
    """(right, lost, gained) of a candidate's result lines against the ids exact answered right."""
    right = {r["id"] for r in rows if r["correct"]}
    return len(right), len(({r["id"] for r in rows} & exact_right) - right), len(right - exact_right)
