"""tune judges a split on real questions as well as needles: only exact's right answers count, a split that
loses more than tolerance(k) of them is refused even when the needles hold, too few right answers leave
the judgement to the needles (and the choice says so); the real subset is fixed and spans every part."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from backend.recall.document_questions import load_questions
from backend.tuning import rules, tune
from backend.tuning.items import RealQuestions, real_counts, real_question_ids
from backend.tuning.tune import Candidate, candidate_keeps, choose, keeps_real, real_informative


def _candidate(split: int, real: RealQuestions, needle_lost: int = 0) -> Candidate:
    needles = rules.keeps_recall(needle_lost, 12, 12)
    return Candidate(split, 12 - needle_lost, 12, 12, 1.5, candidate_keeps(needles, real, ""), lost=needle_lost,
                     real=real)


def _real(k: int, lost: int | None, n: int = 32) -> RealQuestions:
    """A candidate's real questions as measure_real records them (lost None: not run at this split)."""
    if lost is None:
        return RealQuestions(n, k)
    return RealQuestions(n, k, k - lost, lost, 0, keeps_real(lost, 0, k))


def test_a_split_losing_more_than_tolerance_k_of_exacts_right_real_answers_is_refused_though_needles_hold():
    assert real_informative(rules.MIN_REAL_RIGHT) and not real_informative(rules.MIN_REAL_RIGHT - 1)
    assert keeps_real(1, 0, 7) is True and keeps_real(2, 0, 7) is False  # tolerance(7) = 1
    assert keeps_real(2, 0, 24) is True and keeps_real(3, 0, 24) is False  # tolerance(24) = 2
    assert keeps_real(0, 0, 4) is None  # too few right to judge
    # net: the recorded subset at S = 18 (3 lost, 3 gained) keeps them, S = 12's (4 lost, 1 gained) does not
    assert keeps_real(3, 3, 7) is True and keeps_real(4, 1, 7) is False
    # S = 12 keeps every needle and loses 4 of exact's 7 right real answers (what the old default did, in
    # small); S = 15 loses one: 15 is chosen and the reason names the real questions
    s12, s15 = _candidate(12, _real(7, 4)), _candidate(15, _real(7, 1))
    assert not s12.keeps and s15.keeps
    split, why = choose([s12, s15], 18, 12, 12, RealQuestions(32, 7))
    assert split == 15 and "real questions: 1 of exact's 7 right answers lost, 0 gained" in why
    split, why = choose([s12], 18, 12, 12, RealQuestions(32, 7))
    assert split == 18 and "on both needles and real questions" in why
    # a needle loss still refuses a split whose real questions hold
    assert not _candidate(9, _real(7, 0), needle_lost=3).keeps
    # refused for speed: kept real questions do not make it choosable
    assert not candidate_keeps(True, _real(7, 0), "it gains nothing")


def test_too_few_right_real_answers_leave_the_split_to_the_needles_and_the_choice_says_so():
    k = rules.MIN_REAL_RIGHT - 1
    s12 = _candidate(12, _real(k, None))  # not run at the split: it cannot judge it
    assert s12.keeps and s12.real.keeps is None
    split, why = choose([s12], 18, 12, 12, RealQuestions(32, k))
    assert split == 12 and f"exact answered only {k} of 32 real questions right" in why
    assert "judged on needles alone" in why
    split, why = choose([_candidate(12, _real(k, None), needle_lost=5)], 18, 12, 12, RealQuestions(32, k))
    assert split == 18 and "judged on needles alone" in why
    # a tune without real questions says nothing of them
    assert "real" not in choose([_candidate(12, None)], 18, 12, 12, RealQuestions(0, 0))[1]


def test_real_counts_count_only_the_candidates_lines_against_exacts_right_ids():
    rows = [{"id": "realqa/01", "correct": True}, {"id": "realqa/02", "correct": False},
            {"id": "realqa/03", "correct": True}, {"id": "realqa/04", "correct": False}]
    # exact right on 01, 02 and 05 (05 not in the candidate's lines: not counted lost)
    assert real_counts({"realqa/01", "realqa/02", "realqa/05"}, rows) == (2, 1, 1)


def test_the_real_subset_is_fixed_spread_over_each_part_and_spans_every_part():
    questions = load_questions("realqa")
    ids = real_question_ids(questions, 2)
    assert ids == real_question_ids(load_questions("realqa"), 2) and len(ids) == len(set(ids)) == 32
    parts = Counter(questions[i]["document"] for i in ids)
    assert set(parts) == {q["document"] for q in questions} and set(parts.values()) == {2}
    for doc in parts:  # one in each half of the part's questions (they are in text order)
        of_part = [i for i, q in enumerate(questions) if q["document"] == doc]
        first, second = (of_part.index(i) for i in ids if questions[i]["document"] == doc)
        assert first < len(of_part) / 2 <= second
    # a part's questions are asked one after the other (its prefill is shared)
    docs = [questions[i]["document"] for i in ids]
    assert all(docs[j] == docs[j + 1] for j in range(0, 32, 2))
    assert len(real_question_ids(questions, 99)) == len(questions)  # more than a part has: all of it once
    assert real_question_ids(questions, 0) == []


def test_the_output_shows_each_candidates_real_questions(capsys):
    from app.commands.tune import tune_text
    from backend.ridgefill.tuned import summary

    cands = [_candidate(12, _real(7, 4)), _candidate(15, _real(7, 1))]
    split, why = choose(cands, 18, 12, 12, RealQuestions(32, 7))
    r = tune.TuneResult("m", split, 64, "guided", cands, why, 12, 12, 4096, 4096, 1000.0, 0, 1.0, 1500.0,
                        real=RealQuestions(32, 7), real_left_out=["realqa-zlib-faq-part1.txt"])
    text = tune_text(r)
    assert "32 real questions (exact right 7)" in text and "3/32, lost 4 of 7, gained 0" in text
    assert "left out (their prompts do not fit): realqa-zlib-faq-part1.txt" in text and "chosen: S = 15" in text
    brief = json.loads(json.dumps(r.brief()))
    assert brief["candidates"][0]["real_questions"] == {"n": 32, "exact_correct": 7, "correct": 3, "lost": 4,
                                                        "gained": 0, "keeps": False}
    rec = r.record()
    assert rec["real"]["exact_correct"] == 7 and "real questions" in rec["rule"]
    assert summary(json.loads(json.dumps(rec))) == ("S = 15, chosen: recall 12/12 as exact, real questions 6/32 "
                                                    "(exact 7/32), 1.5× at 4K")  # the panel's line


@pytest.mark.slow
def test_tunes_real_question_step_on_two_questions_of_one_part_with_the_real_engine(small_engine, tmp_path,
                                                                                  monkeypatch):
    """Exact and S = 18 (shipped maps) on the two subset questions of the shortest part, the second
    restoring the part's prefill; the counts are the lines'."""
    from backend.recall.run import load_results
    from backend.tuning.items import real_question_items

    engine = small_engine
    items, left_out = real_question_items(engine, 2, 64, room=1272)  # only the 1,219-1,240-token part fits
    assert len(items) == 2 and len(left_out) == 15 and items[0].document == items[1].document
    for it in items:
        it.max_tokens = 8  # a short answer is enough to count
    monkeypatch.setattr(rules, "MIN_REAL_RIGHT", 0)  # two questions judge nothing: let them run anyway
    run = tune._TuneRun(engine, [], "guided", 64, None, None, None, None, lambda text: None, items,
                        out=tmp_path / "tune.jsonl")
    real, right = run.measure_exact_real()
    assert real.n == 2 and real.exact_correct == len(right)
    exact = tune._Exact(0, set(), 0.0, None, 0.0, real, right)
    got, rows = run.measure_real(18, exact, run=True)
    lines = load_results(tmp_path / "tune.jsonl")
    off = [r for r in lines if r["mode"] == "off"]
    assert [r["id"] for r in off] == [it.id for it in items] and off[1]["cache_n"] > 0  # the part restored
    assert [r["mode_run"] for r in rows] == ["guided", "guided"] and all(r["bulk_n"] > 0 for r in rows)
    on = {r["id"] for r in rows if r["correct"]}
    assert (got.correct, got.lost, got.gained) == (len(on), len(right - on), len(on - right))
    assert got.keeps is (got.lost <= rules.tolerance(len(right)))
    assert not run.measure_real(18, exact, run=False)[1]  # needles lost: the real questions are not run
