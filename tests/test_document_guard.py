"""The guard each document gets from the check (backend/ridgefill/departures.py): once the checks of
RidgeFill's answers about a document surely depart (a 95% bound above the check's threshold, after three
or more), that document runs exact from then on, and the answer says why; one corrected answer, or
checks at the yardstick's noise, leave RidgeFill on. On a real document shipped in the repo (the XZ FAQ's
first part)."""
from __future__ import annotations

import json
from dataclasses import replace
from importlib.resources import files

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.answer_check import WITHIN_NLL
from backend.completion import complete
from backend.documents import DocumentText, document_messages
from backend.idle_work import IdleWork
from backend.prefill import ExactPrefill
from backend.ridgefill.departures import FILE_NAME, MIN_CHECKS, Departures, departs, document_key
from backend.ridgefill.plan import RidgeFillPlan, plan_prefill
from backend.ridgefill.runtime import runtime
from backend.user_paths import data_dir
from test_answer_check import _request as _messages_only, _zero_maps_plan, engine  # noqa: F401 - its fixture
from test_quality_mode import SPLIT


QUESTIONS = ["Which compression formats does XZ Utils support?", "What is liblzma?",
             "Which license covers most of XZ Utils?"]


def _request(mode: str, question: str | None = None):
    """The XZ FAQ question (or `question`) as the app sends it: its messages and the document they frame."""
    text = files("backend").joinpath("data", "questions", "realqa-xz-faq-part1.txt").read_text(encoding="utf-8")
    doc = DocumentText("realqa-xz-faq-part1.txt", text, (0,))
    request = _messages_only(mode)
    if question is not None:
        request = replace(request, messages=document_messages([doc], question))
    return replace(request, documents=[doc])


def _checked_after(engine, request, shown) -> dict:
    work = IdleWork(engine, None, refine=True, check=True)
    work.after_completion(request, shown)
    work.run()
    return work.status().answer_check


def test_answers_corrected_again_and_again_send_their_document_to_exact_from_then_on(engine):  # noqa: F811
    requests = [replace(_request("speed", q), split=SPLIT) for q in QUESTIONS]
    request, n = requests[-1], len(engine.prompt_tokens(requests[-1]))
    for asked in range(MIN_CHECKS):  # the same question again is one question's check, its latest
        shown = _zero_maps_answer(engine, requests[0])
        assert _checked_after(engine, requests[0], shown)["verdict"] == "corrected"
    assert isinstance(plan_prefill(engine, request, n), RidgeFillPlan)
    for asked, other in enumerate(requests[1:], 1):  # the worst maps: every question's answer corrected
        assert isinstance(plan_prefill(engine, other, n), RidgeFillPlan), f"exact after {asked} questions"
        shown = _zero_maps_answer(engine, other)
        assert _checked_after(engine, other, shown)["verdict"] == "corrected"

    plan = plan_prefill(engine, request, n)
    assert isinstance(plan, ExactPrefill) and "exact for this document" in plan.note
    assert f"the checks of {MIN_CHECKS} RidgeFill answers" in plan.note
    assert f"beyond the check's {WITHIN_NLL:g} (95% confidence)" in plan.note  # the check's own threshold
    again = complete(engine, request)
    assert again.timings.mode == "off" and "exact for this document" in again.timings.note
    # after a restart too: the next engine reads the same list
    assert Departures(data_dir).why(_key(engine, request)) is not None
    other = _request("speed")
    other.documents[0] = replace(other.documents[0], text=other.documents[0].text + " More.")
    assert Departures(data_dir).why(_key(engine, other)) is None  # another document is not held to it


def _zero_maps_answer(engine, request):
    engine.slot.truncate(0)
    return complete(engine, request, plan=_zero_maps_plan(engine, request))


def test_a_checked_answer_leaves_ridgefill_on(engine):  # noqa: F811
    request = _request("speed")
    engine.slot.truncate(0)
    shown = complete(engine, request)
    check = _checked_after(engine, request, shown)
    n = len(engine.prompt_tokens(request))
    if check["verdict"] == "checked":
        assert isinstance(plan_prefill(engine, request, n), RidgeFillPlan)
    else:  # the shipped maps' answer was corrected: one correction holds nothing to exact
        assert isinstance(plan_prefill(engine, request, n), RidgeFillPlan)


def _key(engine, request) -> str:
    split = SPLIT if request.split is None else request.split
    return document_key(engine.info.path, split, runtime(engine).maps(split).folder, request.documents)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300), st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_any_bytes_in_the_list_mean_no_guard_or_an_entry_never_a_crash(tmp_path_factory, raw):
    folder = tmp_path_factory.mktemp("departed")
    (folder / FILE_NAME).write_bytes(raw)
    departures = Departures(lambda: folder)
    assert departures.why("0" * 64) is None  # no key of the drawn files is 64 characters long
    for i, dnll in enumerate((0.4, 0.4, 0.4)):  # a file name no UTF-8 holds: still written
        departures.checked("1" * 64, ["a\ud800.txt"], f"q{i}", dnll, 0.05)
    assert "exact for this document" in Departures(lambda: folder).why("1" * 64)


def test_a_document_departs_only_when_its_checks_surely_pass_the_threshold(tmp_path):
    """The judge half's checks of q8_0's cache, the yardstick, hold one large ΔNLL among small ones on
    most documents (docs/LONG_DOCUMENTS.md): such a run does not depart; a steady one above does, once."""
    departures = Departures(lambda: tmp_path)
    noise = [0.0, 1.2, 0.0, -0.1, 0.0, 0.3, 0.0, 0.0, -0.05, 0.0]  # corrected twice, at the yardstick's rate
    assert not any(departures.checked("2" * 64, ["a.txt"], f"q{i}", d, 0.05) for i, d in enumerate(noise))
    assert departures.why("2" * 64) is None
    assert not any(departures.checked("5" * 64, ["e.txt"], "one question", 1.2, 0.05) for _ in range(5))
    steady = [0.3, 0.25, 0.4]
    assert [departures.checked("3" * 64, ["b.txt"], f"q{i}", d, 0.05) for i, d in enumerate(steady)] == [False, False, True]
    assert departures.checked("3" * 64, ["b.txt"], "q9", -1.0, 0.05)  # departed stays departed
    assert not departures.checked("6" * 64, ["f.txt"], "q", float("nan"), 0.05)  # not a number: not counted
    note = Departures(lambda: tmp_path).why("3" * 64)
    assert "the checks of 3 RidgeFill answers about it found exact's replies moved by +0.32 nats/token" in note
    assert departs([0.3, 0.3, 0.3], 0.05) and not departs([0.3, 0.3], 0.05)  # fewer than three say nothing


def test_an_entry_of_the_one_correction_rule_or_of_numbers_no_float_holds_holds_nothing_to_exact(tmp_path):
    (tmp_path / FILE_NAME).write_text(json.dumps({"4" * 64: {"documents": ["c.txt"], "dnll": 0.31, "within": 0.05},
                                                  "7" * 64: {"departed_with": [10**400], "checks": {"q": 10**400}}}))
    departures = Departures(lambda: tmp_path)
    assert departures.why("4" * 64) is None and departures.why("7" * 64) is None
    assert not departures.checked("7" * 64, ["g.txt"], "q2", 0.1, 0.05)
