"""Scoring a reply: the first run of exactly 7 digits (or the first uuid) must be the needle's value."""
from __future__ import annotations

import re

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

    One expected value: the first 7-digit run (or uuid) must equal it. Several (multi-value): every
    expected value must be among the reply's 7-digit runs; the answer is the runs joined by commas."""
    if len(expected) > 1:
        runs = seven_digit_runs(reply)
        return set(expected) <= set(runs), (",".join(runs) or None)
    got = first_answer(reply, kind)
    return (got is not None and got == expected[0].lower()), got
