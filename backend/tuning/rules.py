"""Tune's rule: when a setting keeps exact's replies (fidelity, on every document), when it is worth its
maps (speed), and the needle check beside it (backend/tuning/tune.py measures)."""
from __future__ import annotations

from .fidelity_report import WITHIN

MIN_GAIN = 1.05  # a setting must be at least this much faster than exact: below it, nothing is won
RULE = (f"keeps replies: on every document, RidgeFill's mean ΔNLL of exact's replies is at most {WITHIN:g}× "
        "the mean |ΔNLL| of llama.cpp's q8_0 K/V cache on the same questions; a setting that ran another mode, "
        f"or is less than {MIN_GAIN}× faster than exact, is refused; the first keeping setting in order of speed "
        "(lowest split first, speed before guided) is chosen; none: exact. Needles (right exact, wrong at the "
        "setting; at most 1 + n // 24 lost) are a check, reported, not a vote")


def tolerance(n: int) -> int:
    return 1 + n // 24


def informative(exact_correct: int, n: int) -> bool:
    """Whether exact recalls enough needle items for them to judge the maps (at least half)."""
    return n > 0 and 2 * exact_correct >= n


def keeps_recall(lost: int, exact_correct: int, n: int) -> bool | None:
    """The needle check: `lost` items right exact and wrong at the setting; None when the items cannot
    judge (exact recalls fewer than half)."""
    return lost <= tolerance(n) if informative(exact_correct, n) else None
