"""Scoring edge cases, the exact McNemar test on known tables, the bootstrap CI, comparison tables."""
from __future__ import annotations

import math

import pytest

from backend.recall.scoring import first_answer, score, seven_digit_runs
from backend.recall.stats import bootstrap_ci, mcnemar_exact, paired_table
from lab.evals.compare import accuracy, compare


def test_only_a_run_of_exactly_seven_digits_counts():
    assert score("The special magic number is 4729185.", ["4729185"]) == (True, "4729185")
    assert score("472918", ["4729185"])[0] is False  # 6 digits
    assert score("47291856", ["4729185"]) == (False, None)  # 8 digits: not a 7-digit run
    assert score("47291856 then 4729185", ["4729185"]) == (True, "4729185")  # the first 7-digit run
    assert score("1234567 or 4729185", ["4729185"]) == (False, "1234567")  # the first one is the answer
    assert score("4,729,185", ["4729185"]) == (False, None)
    assert score("", ["4729185"]) == (False, None)
    assert seven_digit_runs("a1234567b 12345678 7654321") == ["1234567", "7654321"]


def test_uuid_and_multi_value_scoring():
    u = "3f2a9c1e-5b7d-4e2a-9c1e-5b7d4e2a9c1e"
    assert score(f"It is {u.upper()}.", [u], "uuid") == (True, u)
    assert score(f"It is {u}0.", [u], "uuid") == (False, None)  # longer hex run: not a uuid
    assert first_answer("no uuid here", "uuid") is None
    vals = ["1111111", "2222222", "3333333"]
    assert score("3333333, 1111111 and 2222222", vals)[0] is True  # any order
    assert score("1111111 and 2222222", vals)[0] is False  # one missing
    assert score("1111111, 22222223, 3333333", vals)[0] is False  # an 8-digit run does not count


def test_mcnemar_exact_on_known_tables():
    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(5, 5) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)  # 2 * 0.5**6
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(12, 2) == pytest.approx(2 * (1 + 14 + 91) / 2**14)
    assert mcnemar_exact(3, 4) == 1.0  # capped
    assert mcnemar_exact(0, 5) > 0.05 > mcnemar_exact(0, 6)  # the smallest significant all-one-way table
    with pytest.raises(ValueError):
        mcnemar_exact(-1, 2)
    t = paired_table([True, True, False, False, True], [True, False, True, False, False])
    assert (t["n"], t["both"], t["a_only"], t["b_only"], t["neither"]) == (5, 1, 2, 1, 1)
    assert t["p_mcnemar"] == 1.0


def test_bootstrap_ci_is_seeded_and_covers_the_mean():
    x = [0.01, 0.03, -0.02, 0.05, 0.02, 0.04, 0.0, 0.03]
    lo, hi = bootstrap_ci(x)
    assert lo < sum(x) / len(x) < hi and hi - lo < 0.06
    assert bootstrap_ci(x) == (lo, hi)
    assert bootstrap_ci([0.5] * 5) == (0.5, 0.5)
    lo2, hi2 = bootstrap_ci([v + 1 for v in x])
    assert math.isclose(lo2, lo + 1) and math.isclose(hi2, hi + 1)


def _rec(i, mode, correct, region="bulk", length=2048, depth=0.1, variant="single"):
    return {"id": f"x{i}", "mode": mode, "split": 18 if mode != "off" else None, "tail": 512, "correct": correct,
            "region": region, "length": length, "depth": depth, "variant": variant}


def test_comparison_pairs_by_item_and_breaks_down():
    off = [_rec(i, "off", True, region="bulk" if i < 8 else "tail") for i in range(10)]
    speed = [_rec(i, "speed", i >= 6, region="bulk" if i < 8 else "tail") for i in range(10)] + [_rec(99, "speed", True)]
    c = compare(off, speed, "off", "speed")
    assert c["paired"] == 10 and c["only_b"] == 1
    assert c["overall"]["a_only"] == 6 and c["overall"]["b_only"] == 0
    assert c["overall"]["p_mcnemar"] == pytest.approx(2 / 64)
    assert c["region"]["bulk"]["acc_b"] == pytest.approx(2 / 8) and c["region"]["tail"]["acc_b"] == 1.0
    a = accuracy(speed)
    assert a["overall"]["correct"] == 5 and a["region"]["tail"]["acc"] == 1.0
