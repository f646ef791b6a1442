"""Scoring a reply: the first run of exactly 7 digits (or the first uuid) must be the needle's value; a
question about a real document (backend/recall/document_questions.py) is right when the reply holds one of
its accepted answers as a whole phrase."""
from __future__ import annotations

import re
import unicodedata

_DIGIT_RUN = re.compile(r"\d+")
_UUID = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![0-9a-fA-F])")


def seven_digit_runs(reply: str) -> list[str]:
    """Maximal digit runs of length exactly 7 (a 6- or 8-digit run is not a 7-digit answer)."""
    return [m for m in _DIGIT_RUN.findall(reply) if len(m) == 7]


def first_answer(reply: str, kind: str = "number") -> str | None:
    if kind == "uuid":
        m = _UUID.search(reply)
        return m.group(0).lower() if m else None
    runs = seven_digit_runs(reply)
    return runs[0] if runs else None


def score(reply: str, expected: list[str], kind: str = "number") -> tuple[bool, str | None]:
    """(correct, the answer read from the reply).

    kind "phrase": any one of `expected` (the accepted forms of one answer) held as a whole phrase.
    One expected value: the first 7-digit run (or uuid) must equal it. Several (multi-value): every
    expected value must be among the reply's 7-digit runs; the answer is the runs joined by commas."""
    if kind == "phrase":
        found = [a for a in expected if answer_found(reply, [a])]
        return bool(found), (found[0] if found else None)
    if len(expected) > 1:
        runs = seven_digit_runs(reply)
        return set(expected) <= set(runs), (",".join(runs) or None)
    got = first_answer(reply, kind)
    return (got is not None and got == expected[0].lower()), got


def _normal(text: str) -> str:
    """Case, Unicode forms, markdown quoting and runs of white space do not count."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[`*\"\u201c\u201d]", " ", text).split())


def answer_found(reply: str, answers: list[str]) -> bool:
    """Whether the reply holds one of the accepted answers as a whole phrase ("8 MiB" is not in "18 MiB"),
    a number not inside a longer one."""
    text = _normal(reply)
    return any(re.search(rf"(?<!\w)(?<!\d[.,]){re.escape(_normal(a))}(?!\w)(?![.,]\d)", text) for a in answers)


# A sentence ends at . ! or ? followed by white space, or at a line break ("5.2.3" and "e.g.x" go on).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n")


def first_sentence(reply: str) -> str:
    """The reply's first sentence: what it claims first (an empty reply: "")."""
    text = reply.strip()
    return _SENTENCE_END.split(text, maxsplit=1)[0] if text else ""


def claim_right(reply: str, answers: list[str], wrong: list[str] = ()) -> bool:
    """Whether the reply's first sentence claims the answer: it holds an accepted form and names none of
    the listed rivals ("the latest version is 2.4.6" is wrong when 2.4.6 is the oldest and listed)."""
    claim = first_sentence(reply)
    return answer_found(claim, answers) and not (wrong and answer_found(claim, list(wrong)))


def same_claim(a: str, b: str) -> bool:
    """Whether two replies' first sentences say the same words, case, punctuation and spacing aside."""
    def words(text: str) -> list[str]:
        return re.sub(r"[^\w\s]", " ", _normal(first_sentence(text))).split()
    return words(a) == words(b)
