"""The guard each document gets from the check (backend/ridgefill/departures.py): once the check corrects
a RidgeFill answer about a document, that document runs exact from then on, and the answer says why; a
checked answer leaves RidgeFill on. On a real document shipped in the repo (the XZ FAQ's first part)."""
from __future__ import annotations

import json
from dataclasses import replace
from importlib.resources import files

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.answer_check import WITHIN_NLL
from backend.completion import complete
from backend.documents import DocumentText
from backend.idle_work import IdleWork
from backend.prefill import ExactPrefill
from backend.ridgefill.departures import FILE_NAME, Departures, document_key
from backend.ridgefill.plan import RidgeFillPlan, plan_prefill
from backend.ridgefill.runtime import runtime
from backend.user_paths import data_dir
from test_answer_check import _request as _messages_only, _zero_maps_plan, engine  # noqa: F401 - its fixture
from test_quality_mode import SPLIT


def _request(mode: str):
    """The XZ FAQ question as the app sends it: its messages and the document they frame."""
    request = _messages_only(mode)
    text = files("backend").joinpath("data", "questions", "realqa-xz-faq-part1.txt").read_text(encoding="utf-8")
    return replace(request, documents=[DocumentText("realqa-xz-faq-part1.txt", text, (0,))])


def _checked_after(engine, request, shown) -> dict:
    work = IdleWork(engine, None, refine=True, check=True)
    work.after_completion(request, shown)
    work.run()
    return work.status().answer_check


def test_a_corrected_answer_sends_its_document_to_exact_from_then_on(engine):  # noqa: F811
    request = replace(_request("speed"), split=SPLIT)
    engine.slot.truncate(0)
    shown = complete(engine, request, plan=_zero_maps_plan(engine, request))  # the worst maps: corrected
    assert isinstance(plan_prefill(engine, request, len(engine.prompt_tokens(request))), RidgeFillPlan)
    assert _checked_after(engine, request, shown)["verdict"] == "corrected"

    plan = plan_prefill(engine, request, len(engine.prompt_tokens(request)))
    assert isinstance(plan, ExactPrefill) and "exact for this document" in plan.note
    assert f"more than the check's {WITHIN_NLL:g})" in plan.note  # the check's own threshold, given by its caller
    again = complete(engine, request)
    assert again.timings.mode == "off" and "corrected by the check" in again.timings.note
    # after a restart too: the next engine reads the same list
    assert Departures(data_dir).why(_key(engine, request)) is not None
    other = _request("speed")
    other.documents[0] = replace(other.documents[0], text=other.documents[0].text + " More.")
    assert Departures(data_dir).why(_key(engine, other)) is None  # another document is not held to it


def test_a_checked_answer_leaves_ridgefill_on(engine):  # noqa: F811
    request = _request("speed")
    engine.slot.truncate(0)
    shown = complete(engine, request)
    check = _checked_after(engine, request, shown)
    n = len(engine.prompt_tokens(request))
    if check["verdict"] == "checked":
        assert isinstance(plan_prefill(engine, request, n), RidgeFillPlan)
    else:  # the shipped maps' answer was corrected: then it is held to exact like any other
        assert isinstance(plan_prefill(engine, request, n), ExactPrefill)


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
    departures.record("1" * 64, ["a\ud800.txt"], None)  # a file name no UTF-8 holds: still written
    assert "exact for this document" in Departures(lambda: folder).why("1" * 64)


def test_the_note_names_the_threshold_the_entry_was_recorded_with(tmp_path):
    departures = Departures(lambda: tmp_path)
    departures.record("2" * 64, ["a.txt"], 0.31, within=0.07)
    departures.record("3" * 64, ["b.txt"], 0.31)  # an entry written before the threshold was kept with it
    assert "(ΔNLL +0.31 nats/token, more than the check's 0.07)" in Departures(lambda: tmp_path).why("2" * 64)
    assert "(ΔNLL +0.31 nats/token)" in Departures(lambda: tmp_path).why("3" * 64)
