"""Every fast answer checked against exact's: once the document is exact, the idle work has the exact
model answer the same request from that cache, and marks RidgeFill's answer checked (the same claim)
or corrected (another). On a real document shipped in the repo (the XZ FAQ's first part), with the
embedded model and its shipped maps."""
from __future__ import annotations

from dataclasses import replace
from importlib.resources import files

import pytest

from app import chat_session
from app.conversations import Conversation, Message
from backend.answer_check import WITHIN_NLL, check_answer
from backend.completion import complete
from backend.documents import DocumentText, document_messages
from backend.engine import Engine, EngineConfig
from backend.idle_work import IdleWork
from backend.protocol import CompletionRequest
from backend.answers import answers_agree
from backend.reply_score import reply_nll
from test_quality_mode import ZeroMaps

QUESTION = "Which file format does xz use by default?"
ROUNDING_NLL = 0.05  # nats/token: the micro-batch rounding level, far below a wrong reply's (the test below)


@pytest.fixture(scope="module")
def engine(model_path):
    e = Engine(EngineConfig(model_path, n_ctx=4096, n_batch=512, n_ubatch=512))
    yield e
    e.close()


def _request(mode: str) -> CompletionRequest:
    text = files("backend").joinpath("data", "questions", "realqa-xz-faq-part1.txt").read_text(encoding="utf-8")
    doc = DocumentText("realqa-xz-faq-part1.txt", text, (0,))
    return CompletionRequest(messages=document_messages([doc], QUESTION), max_tokens=24, mode=mode, tail=64)


def _exact_answer(engine, request: CompletionRequest):
    engine.slot.truncate(0)
    return complete(engine, replace(request, mode="off", reuse_prefix=False))


def test_the_idle_work_checks_a_ridgefill_answer_against_exact_answering_from_the_exact_cache(engine):
    request = _request("speed")
    shown = complete(engine, request)
    assert shown.timings.bulk_n > 0  # rows were approximated: there is something to check
    work = IdleWork(engine, None, refine=True, check=True)
    work.after_completion(request, shown)
    work.run()
    check = work.status().answer_check
    assert check is not None and engine.slot.record.all_exact
    check_tokens = list(work.last_check.exact_tokens)
    same = answers_agree(shown.text, check["exact_answer"]) or check["dnll"] <= WITHIN_NLL
    assert check["verdict"] == ("checked" if same else "corrected")
    assert check["shown_answer"] == shown.text and check["dnll"] is not None
    # The check answered on an exact cache: on a fresh exact prefill its answer is at least as likely as
    # exact's own there, up to rounding (the refined rows were computed in other batches: a near tie may
    # flip, and greedy's reply is not the likeliest one).
    exact = _exact_answer(engine, request)
    prompt = engine.prompt_tokens(request)
    own = reply_nll(engine, prompt, list(exact.tokens))
    assert reply_nll(engine, prompt, check_tokens) - own < ROUNDING_NLL


def test_an_answer_exact_would_not_give_is_corrected(engine):
    from backend.ridgefill.refine import Refinement

    request = _request("speed")
    engine.slot.truncate(0)
    shown = complete(engine, request, plan=_zero_maps_plan(engine, request))  # the worst maps: a wrong answer
    refinement = Refinement(engine)
    while not engine.slot.record.all_exact:
        refinement.step()
    check = check_answer(engine, request, shown)
    assert check.verdict == "corrected" and not answers_agree(shown.text, check.exact_answer)
    assert check.dnll is not None and check.dnll > WITHIN_NLL  # exact finds the wrong reply far less likely
    assert engine.slot.record.all_exact


def _zero_maps_plan(engine, request):
    from backend.ridgefill.plan import plan_ridgefill

    return plan_ridgefill(engine, len(engine.prompt_tokens(request)), "speed", ZeroMaps.split, 64, maps=ZeroMaps())


def _conversation(answer: str, mode: str = "speed") -> Conversation:
    return Conversation(messages=[Message("user", QUESTION), Message("assistant", answer, timings={"mode": mode})])


def test_a_check_marks_the_answer_it_is_for_and_a_correction_shows_exact_answer():
    conv = _conversation("LZMA2")
    checked = {"verdict": "checked", "shown_answer": "LZMA2", "exact_answer": "LZMA2.", "dnll": 0.0}
    assert chat_session.apply_check(conv, checked) is conv.messages[1]
    assert conv.messages[1].check == checked and conv.messages[1].content == "LZMA2"
    assert chat_session.apply_check(conv, checked) is None  # a second report of the same check changes nothing

    conv = _conversation("Answer:")
    corrected = {"verdict": "corrected", "shown_answer": "Answer:", "exact_answer": "The .xz format.", "dnll": 1.2}
    m = chat_session.apply_check(conv, corrected)
    assert m.content == "The .xz format." and m.check["shown_answer"] == "Answer:"


def test_a_check_for_another_answer_or_an_exact_one_is_not_applied():
    conv = _conversation("LZMA2")
    assert chat_session.apply_check(conv, {"verdict": "corrected", "shown_answer": "other", "exact_answer": "x"}) is None
    assert conv.messages[1].content == "LZMA2" and conv.messages[1].check is None
    exact = _conversation("LZMA2", mode="off")
    assert chat_session.apply_check(exact, {"verdict": "checked", "shown_answer": "LZMA2"}) is None
