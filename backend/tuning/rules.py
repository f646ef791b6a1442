"""Tune's rule: when a candidate split keeps exact's recall (needle items and the real questions exact
answers right), and when the items are too few or too hard to judge it (backend/tuning/tune.py measures)."""
from __future__ import annotations

from .items import RealQuestions

MIN_GAIN = 1.05  # a candidate must be at least this much faster than exact: below it, nothing is won
# Real questions judge a split only when exact answers at least this many right: with k = 5 a split that
# loses three in four of them (SmolLM2 at S = 12: 30 of 41) still keeps them (1 lost at most) 2% of the
# time, with k = 4 6%, with k = 3 18%: fewer right answers say nothing about the maps.
MIN_REAL_RIGHT = 5
RULE = ("keeps recall: at most 1 + n // 24 needle items lost (right exact, wrong at the split), decided only "
        "when exact recalls at least half of them; and of the k real questions exact answers right, at most "
        f"1 + k // 24 more lost than gained, judged only when k >= {MIN_REAL_RIGHT} (else needles alone); the "
        f"lowest candidate that keeps both is chosen; a candidate whose requests ran exact, or less than "
        f"{MIN_GAIN}x faster than exact, is refused")


def tolerance(n: int) -> int:
    return 1 + n // 24


def informative(exact_correct: int, n: int) -> bool:
    """Whether exact recalls enough of the items for them to judge the maps (at least half)."""
    return n > 0 and 2 * exact_correct >= n


def keeps_recall(lost: int, exact_correct: int, n: int) -> bool:
    """`lost`: items exact answered right and the candidate wrong."""
    return informative(exact_correct, n) and lost <= tolerance(n)


def real_informative(k: int) -> bool:
    """Whether exact answers enough real questions right (k) for them to judge the maps."""
    return k >= MIN_REAL_RIGHT


def keeps_real(lost: int, gained: int, k: int) -> bool | None:
    """Whether a candidate keeps exact's k right real answers: at most tolerance(k) more lost (right exact,
    wrong at the split) than gained (the reverse); None when k is too few to judge. Net, not lost alone: real
    answers flip both ways (S = 18 on all 191 lost 11 and gained 9, p = 0.82), and a losses-only rule
    refused it on 32 items (3 lost, 3 gained) as it refused S = 12 (4 lost, 1 gained)."""
    return lost - gained <= tolerance(k) if real_informative(k) else None


def candidate_keeps(needles: bool, real: RealQuestions | None, refused: str) -> bool:
    """Whether a measured candidate may be chosen: it keeps the needles, it keeps real questions where they
    judge it, and nothing refused it."""
    return needles and not refused and (real is None or real.keeps is not False)


def real_unjudged(real: RealQuestions) -> str:
    """Why the real questions do not judge the splits; "" when they do (or none were run)."""
    if real.n == 0 or real_informative(real.exact_correct):
        return ""
    return (f"exact answered only {real.exact_correct} of {real.n} real questions right (needs {MIN_REAL_RIGHT}): "
            "judged on needles alone")
