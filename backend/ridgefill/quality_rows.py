"""Quality mode's choice of the bulk rows to make exact again (redecode.py decodes them).

The score is a token class, not a learned one: digits (numbers, codes, dates) first, then capitalised
pieces (names, keys), then rarer pieces (a higher BPE id is a later, rarer merge).
"""
from __future__ import annotations

from .redecode import Run, runs_of

DEFAULT_SHARE = 0.10  # of the bulk rows: the budget of rows made exact
# A number is only found again if the words that introduce it ("... number for owl is") and the token
# that ends it are exact too (docs/measurements/guided-design.md#number-rows-12-before-2-after).
NUMBER_LEAD = 12
NUMBER_TRAIL = 2


def token_score(piece: str, token: int, n_vocab: int) -> float:
    text = piece.strip()
    score = token / max(1, n_vocab)  # rarity, in [0, 1)
    if any(c.isdigit() for c in text):
        score += 4.0
    if text[:1].isupper():
        score += 2.0
    return score


def select_runs(engine, tokens: list[int], start: int, end: int, share: float = DEFAULT_SHARE,
                max_run: int | None = None) -> list[Run]:
    """The runs of rows in [start, end) to make exact, in position order: rows taken by score (a digit
    row brings NUMBER_LEAD rows before it and NUMBER_TRAIL after) until `share` of the rows are taken,
    then merged into runs where they lie within MERGE_GAP rows of each other."""
    n = end - start
    budget = int(round(share * n))
    if n <= 0 or budget <= 0:
        return []
    max_run = max_run or engine.ubatch_rows
    scores = [(token_score(engine.token_text(tokens[p]), tokens[p], engine.n_vocab), p) for p in range(start, end)]
    chosen: set[int] = set()
    for score, p in sorted(scores, key=lambda sp: (-sp[0], sp[1])):
        if len(chosen) >= budget:
            break
        if score >= 4.0:  # a digit
            chosen.update(range(max(start, p - NUMBER_LEAD), min(end, p + 1 + NUMBER_TRAIL)))
        else:
            chosen.add(p)
    return runs_of(chosen, max_run)
