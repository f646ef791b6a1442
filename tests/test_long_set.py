"""The long real-question set and how fidelity reads and scores it, without a model: the set is what its
README says (documents, questions, answers in place and spread, licences), question files from outside
are read or refused with a message, a claim is scored and not a mention, and the report's figures are
what the lines say."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backend.errors import DocumentError
from backend.recall.scoring import claim_right, first_sentence, same_claim
from backend.stopping import AnswerEnd
from backend.vocabulary import plain_prompt
from backend.tuning.fidelity import parse_setting
from backend.tuning.fidelity_report import report, summarize
from backend.tuning.question_files import CHOOSE, JUDGE, long_set, long_set_dir, parse_questions


@pytest.fixture(scope="module")
def documents():
    return long_set()


def test_the_set_holds_at_least_12_whole_documents_and_600_questions_in_both_halves(documents):
    assert len(documents) >= 12
    assert sum(len(d.questions) for d in documents) >= 600
    halves = {d.half for d in documents}
    assert halves == {CHOOSE, JUDGE}
    for half in halves:
        assert sum(len(d.questions) for d in documents if d.half == half) >= 250
    # 4K-32K tokens at about 3.5-4.5 characters a token, on either embedded model's vocabulary
    assert all(14_000 <= len(d.text) <= 110_000 for d in documents), [(d.name, len(d.text)) for d in documents]


def test_every_answer_is_in_its_document_and_the_answers_cover_its_whole_length(documents):
    for d in documents:
        raw = json.loads((long_set_dir() / d.name.replace(".txt", ".json")).read_text(encoding="utf-8"))
        places = []
        for q in raw:
            start = d.text.find(q["after"]) if q.get("after") else 0
            at = d.text.find(q["answer"], start)
            assert start >= 0 and at >= 0 and "\n" not in q["answer"], (d.name, q)
            assert not any(w.lower() in q["answer"].lower() for w in q.get("wrong", [])), (d.name, q)
            places.append(at / len(d.text))
        tenths = {int(10 * p) for p in places}
        assert len(tenths) >= 9, (d.name, sorted(tenths))  # every tenth (or all but one) is asked about


def test_the_readme_records_every_documents_licence(documents):
    readme = (long_set_dir() / "README.md").read_text(encoding="utf-8")
    licences = readme[readme.index("## Licences"):]
    for d in documents:
        assert f"| {d.name} |" in licences, d.name


def test_a_question_file_from_outside_is_read_or_refused_with_what_is_wrong():
    qs = parse_questions([{"question": "What?", "answer": "42", "accept": ["forty-two"], "wrong": ["41"]},
                          {"question": "Why?"}], "doc.txt")
    assert qs[0].answers == ["42", "forty-two"] and qs[0].wrong == ["41"] and qs[1].answers == []
    for bad, says in (([], "non-empty"), ([{"answer": "1"}], "entry 0"), ([{"question": "Q", "hint": 1}], "hint"),
                      ([{"question": "Q", "answer": 3}], "strings")):
        with pytest.raises(DocumentError, match=says):
            parse_questions(bad, "doc.txt")


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["question", "answer", "accept", "wrong", "after", "x"]), inner, max_size=5),
                     max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_json)
def test_any_json_as_a_question_file_gives_questions_or_a_document_error(raw):
    try:
        for q in parse_questions(raw, "doc.txt"):
            assert q.question and all(isinstance(a, str) and a for a in q.answers + q.wrong)
    except DocumentError:
        pass


def test_the_claim_is_scored_not_a_mention():
    answers, wrong = ["1.2.4"], ["2.4.6"]
    assert claim_right("The oldest version is 1.2.4. Later came 2.4.6.", answers, wrong)
    assert not claim_right("The oldest version is 2.4.6, after 1.2.4.", answers, wrong)  # a wrong claim
    assert not claim_right("It is not stated.\nThe versions are 1.2.4 and 2.4.6.", answers, wrong)  # too late
    assert claim_right(" `1.2.4`", answers, wrong) and claim_right("It prints 4.", ["4"])
    assert not claim_right("4.567e21", ["4"]) and not claim_right("Version 1.4", ["4"])  # a longer number
    assert first_sentence("Version 5.2.3 was the first. Then more.") == "Version 5.2.3 was the first."
    assert same_claim("The answer is **42**.  More words.", "the answer is 42. Other words.")
    assert not same_claim("The answer is 42.", "The answer is 43.")


def test_settings_name_a_mode_a_split_or_a_kv_cache():
    assert parse_setting("guided:5").split == 5 and parse_setting("guided").split is None
    assert parse_setting("q8").kv_type == "q8_0" and parse_setting("q8").mode == "off"
    assert parse_setting("mb128").ubatch == 128
    for bad in ("fast", "q8:3", "guided:x", "plumb"):
        with pytest.raises(DocumentError):
            parse_setting(bad)


def _line(setting, i, reply, nll, right, doc="a.txt", n=5000):
    return {"kind": "fidelity", "id": f"{doc}/{i:02d}", "document": doc, "half": JUDGE, "setting": setting,
            "reply": reply, "nll_ref": nll, "right": right, "prompt_n": n}


def test_the_report_pairs_each_setting_with_exact_on_the_same_items():
    lines = [_line("off", 0, "It is 4.", 0.5, True), _line("off", 1, "It is 7.", 1.0, False),
             _line("off", 2, "It is 9.", 0.2, True),
             _line("guided", 0, "It is 4.", 0.6, True), _line("guided", 1, "It is 8.", 1.4, True),
             _line("guided", 2, "It is 1.", 0.2, False),
             _line("mb128", 0, "It is 4.", 0.5, True), _line("mb128", 1, "It is 7.", 1.0, False),
             _line("mb128", 2, "It is 3.", 0.2, False)]
    figures = report(lines)["guided"]["all"]
    assert figures["n"] == 3 and figures["changed"] == 2
    assert figures["dnll"] == pytest.approx((0.1 + 0.4 + 0.0) / 3) and figures["abs_dnll"] == pytest.approx(0.5 / 3)
    assert (figures["exact_right"], figures["right"], figures["kept"]) == (2, 2, 1)
    assert (figures["stable"], figures["stable_kept"]) == (1, 1)  # item 2 is right only at micro-batch 512
    assert summarize([])["n"] == 0


def test_a_base_models_prompt_ends_in_the_answer_cue_and_its_answer_at_the_paragraphs_end():
    chat = [{"role": "user", "content": "Doc.\n\nQuestion: a?"}, {"role": "assistant", "content": "A."},
            {"role": "user", "content": "Question: b?"}]
    assert plain_prompt(chat) == "Doc.\n\nQuestion: a?\nAnswer: A.\n\nQuestion: b?\nAnswer:"
    end = AnswerEnd(ends=["\n\n", "\nQuestion:"])
    assert end.feed("\n\n") is None  # not ended before it begins
    assert end.feed(" 1.2.4\n\nQuestion: c?") == "stop" and end.text.strip() == "1.2.4"
