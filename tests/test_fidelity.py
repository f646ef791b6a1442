"""Fidelity on the real embedded model: exact's reply teacher-forced on a setting's cache gives the
likelihood the NLL machinery gives, each setting answers every question, a rerun resumes, and the
command prints the figures for a user's own document and questions."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from backend.recall.document_questions import questions_dir
from backend.tuning.fidelity import FidelityRun, item_request, parse_setting, reply_nll
from lab.evals.nll import token_logprobs
from backend.tuning.question_files import QuestionedDocument, parse_questions

ROOT = Path(__file__).resolve().parents[1]
DOC = "realqa-gnupg-readme-part1.txt"  # about 1,500 tokens: a bulk of more than 1,024 rows
QUESTIONS = [{"question": "Which program verifies signatures?", "answer": "gpgv"},
             {"question": "Which RFC defines the OpenPGP standard?", "answer": "RFC4880", "accept": ["RFC 4880"]}]


@pytest.fixture(scope="module")
def document():
    text = (questions_dir() / DOC).read_text(encoding="utf-8")
    return QuestionedDocument(DOC, text, parse_questions(QUESTIONS, DOC))


def test_exacts_reply_teacher_forced_has_the_likelihood_the_nll_machinery_gives(small_engine, document):
    from backend.completion import complete

    request = item_request(document, document.questions[0].question, parse_setting("off"))
    prompt = small_engine.prompt_tokens(request)
    reply = list(complete(small_engine, request).tokens)
    assert len(reply) > 2
    ours = reply_nll(small_engine, prompt, reply)
    complete(small_engine, request)
    other = reply_nll(small_engine, prompt, reply[:1] + [reply[0]] * (len(reply) - 1))
    theirs = -token_logprobs(small_engine, prompt + reply, len(reply)).mean()
    assert ours == pytest.approx(theirs, abs=1e-2)  # the rows are batched differently: rounding only
    assert other > ours  # another reply is less likely


def test_every_question_is_answered_exact_first_and_a_rerun_resumes(small_engine, document, tmp_path):
    out = tmp_path / "f.jsonl"
    settings = [parse_setting("guided")]
    lines = FidelityRun(lambda setting: small_engine, "smollm2", out).run([document], settings)
    by = {(r["id"], r["setting"]): r for r in lines}
    assert len(by) == 4 and all(r["nll_ref"] is not None and np.isfinite(r["nll_ref"]) for r in lines)
    for q in document.questions:
        exact, guided = by[q.id, "off"], by[q.id, "guided"]
        assert guided["mode_run"] == "guided" and guided["bulk_n"] > 0 and guided["shared_rows"] > 0
        assert exact["ref_n"] == guided["ref_n"] == len(exact["reply_tokens"])  # exact's reply, scored on both
        assert exact["right"] is not None and exact["shared_rows"] >= guided["shared_rows"]  # exact may share the tail too
    n = len(out.read_text().splitlines())
    FidelityRun(lambda setting: small_engine, "smollm2", out).run([document], settings)
    assert len(out.read_text().splitlines()) == n  # nothing run twice


def test_the_command_checks_a_users_own_document_and_questions(tmp_path):
    questions = tmp_path / "q.json"
    questions.write_text(json.dumps(QUESTIONS[:1]), encoding="utf-8")
    out = tmp_path / "f.jsonl"
    r = subprocess.run([sys.executable, "-m", "lab", "--ctx", "2048", "fidelity", "--doc", str(questions_dir() / DOC),
                        "--questions", str(questions), "--modes", "mb128", "--out", str(out), "--json"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout)
    assert figures["exact"]["n"] == 1 and figures["settings"]["mb128"]["all"]["n"] == 1
    mb128 = figures["settings"]["mb128"]["all"]
    assert "dnll" in mb128 and abs(mb128["dnll"]) < 0.05  # rounding moves exact's reply little
    bad = subprocess.run([sys.executable, "-m", "lab", "fidelity", "--doc", str(questions_dir() / DOC)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--questions" in bad.stderr
