"""The real-QA set: every answer is in its document where the question says, the set is big enough, every
document's source and licence are recorded, and the answer rule takes whole phrases only."""
from __future__ import annotations

import re

from backend.recall.document_questions import QUESTION_SETS, accepted, load_questions, questions_dir
from backend.recall.scoring import answer_found
from lab.evals.paired_questions import paired_questions, rescored


def _documents(questions) -> set[str]:
    return {q["document"] for q in questions}


def test_every_answer_is_in_its_document_after_its_anchor():
    for q in load_questions("realqa"):
        text = (questions_dir() / q["document"]).read_text(encoding="utf-8")
        after = q.get("after")
        start = text.find(after) if after else 0
        assert start >= 0, f"{q['document']}: the anchor {after!r} is not in the text"
        assert text.find(q["answer"], start) >= 0, f"{q['document']}: {q['answer']!r} is not in the text"
        assert "\n" not in q["answer"], "an answer is written on one line"


def test_the_set_has_150_questions_over_8_documents_round_robin():
    questions = load_questions("realqa")
    assert "realqa" in QUESTION_SETS
    assert len(questions) >= 150
    docs = _documents(questions)
    assert len(docs) >= 8
    # round-robin: the first len(docs) questions ask every document once (a partial run holds them all)
    assert _documents(questions[: len(docs)]) == docs


def test_every_document_has_its_source_and_licence_recorded():
    readme = (questions_dir() / "README.md").read_text(encoding="utf-8")
    for doc in _documents(load_questions("realqa")):
        row = re.search(rf"^\| {re.escape(doc)} \|([^|]+)\|([^|]+)\|([^|]+)\|$", readme, re.MULTILINE)
        assert row is not None, f"{doc} has no row in the README's table"
        source, licence, why = (c.strip() for c in row.groups())
        assert "/usr/share/doc/" in source and "(" in source, f"{doc}: package, version and path"
        assert licence and why, f"{doc}: licence and why it may be redistributed"


def test_answer_found_takes_whole_phrases_in_any_case_and_quoting():
    assert answer_found("It uses an 8 MiB LZMA2 dictionary.", ["8 MiB"])
    assert not answer_found("It uses an 18 MiB dictionary.", ["8 MiB"])
    assert answer_found("Run `ZSTD_BIN`", ["zstd_bin"])
    assert answer_found("The default is **Release**.", ["Release"])
    assert not answer_found("libcrypt.so.12", ["libcrypt.so.1"])
    assert answer_found("use the  LGPL", ["GNU Lesser General", "LGPL"])
    assert not answer_found("", ["LGPL"])


def test_rescored_marks_question_lines_by_the_phrase_and_leaves_others():
    lines = [{"id": "realqa/00", "haystack": "realqa", "reply": "It means nothing.", "expected": ["Nothing"],
              "correct": False, "answer": None},
             {"id": "n/00", "haystack": "filler", "reply": "1234567", "expected": ["1234567"], "correct": True}]
    first, other = rescored(lines)
    assert first["correct"] is True and first["answer"] == "Nothing"
    assert other == lines[1]
    assert rescored([{**lines[0], "reply": "It means something."}])[0]["correct"] is False


def _line(i: int, mode: str, reply: str) -> dict:
    return {"kind": "recall", "id": f"realqa/{i:02d}", "mode": mode, "split": 12 if mode != "off" else None,
            "tail": 64, "mode_run": mode, "note": None, "haystack": "realqa", "depth": 0.2 * (i + 1),
            "expected": accepted(load_questions("realqa")[i]), "reply": reply, "correct": False}


def test_paired_questions_counts_per_document_and_depth_and_lists_the_losses():
    questions = load_questions("realqa")
    right = [q["answer"] for q in questions[:3]]
    lines = [_line(0, "off", right[0]), _line(0, "guided", "no idea"),    # exact only
             _line(1, "off", right[1]), _line(1, "guided", right[1]),     # both
             _line(2, "off", "no idea"), _line(2, "guided", right[2]),    # guided only
             _line(8, "off", "no idea")]                                  # unpaired: left out
    got = paired_questions(lines, "realqa")
    assert got["overall"] == {"n": 3, "both": 1, "a_only": 1, "b_only": 1, "neither": 0, "p_mcnemar": 1.0}
    assert got["document"][questions[0]["document"]]["a_only"] == 1
    assert set(got["depth"]) == {"beginning", "middle"}  # depths 0.2, 0.4, 0.6
    assert got["depth"]["beginning"]["a_only"] == 1 and got["depth"]["middle"]["n"] == 2
    assert got["depth"]["middle"]["b_only"] == 1
    assert [x["id"] for x in got["lost"]] == ["realqa/00"] and got["lost"][0]["guided"] == "no idea"


def test_the_losses_are_split_by_whether_the_answers_rows_were_made_exact_and_what_the_oracle_says():
    from lab.evals.report import questions_text

    questions = load_questions("realqa")
    right = [q["answer"] for q in questions[:3]]
    lines = [_line(0, "off", right[0]), {**_line(0, "guided", "no idea"), "answer_exact": False, "region": "bulk"},
             {**_line(0, "guided+answer", right[0]), "mode_run": "guided"},            # lost, not selected, rescued
             _line(1, "off", right[1]), {**_line(1, "guided", "no"), "answer_exact": True, "region": "bulk"},
             {**_line(1, "guided+answer", "no"), "mode_run": "guided"},                # lost though selected
             _line(2, "off", right[2]), {**_line(2, "guided", right[2]), "answer_exact": True, "region": "bulk"}]
    got = paired_questions(lines, "realqa")
    assert [(x["selected"], x["rescued"]) for x in got["lost"]] == [(False, True), (True, False)]
    assert got["hit_rate"] == {"n": 3, "hits": 2}
    text = questions_text(got)
    assert "answer's rows not made exact: 1 (the oracle, the answer's rows made exact too, answers 1 of 1)" in text
    assert "answer's rows made exact: 1 (the oracle, the answer's rows made exact too, answers 0 of 1)" in text
    assert "for 2 of 3 answers in the bulk" in text


def test_recall_scores_a_question_by_its_accepted_phrases():
    """recall scored every reply by its first 7-digit run, so every question came out wrong."""
    from backend.recall.scoring import score

    assert score("The RFC that defines it is RFC 4880.", ["RFC4880", "RFC 4880"], "phrase") == (True, "RFC 4880")
    assert score("It is RFC 48801.", ["RFC4880", "RFC 4880"], "phrase") == (False, None)
    assert score("The passkey is 1234567.", ["1234567"]) == (True, "1234567")  # needles as before
