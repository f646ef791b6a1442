"""The headless CLI, run as users run it: `python -m app ...` in a child interpreter."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def cli(*args, timeout=300):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_info_prints_the_models_shape():
    r = cli("info", "--json")
    assert r.returncode == 0, r.stderr
    facts = json.loads(r.stdout)
    assert (facts["architecture"], facts["layers"], facts["width"], facts["heads"], facts["kv_heads"]) == \
        ("llama", 30, 576, 9, 3)
    assert facts["context_length"] == 8192 and facts["threads"] >= 1


def test_chat_answers_about_a_document(tmp_path):
    doc = tmp_path / "memo.txt"
    doc.write_text("Memo to all staff.\n\nThe passkey of the storeroom is 5820417. Keep it safe.\n\n"
                   + "The canteen opens at noon. The car park closes at nine. " * 30)
    r = cli("chat", "--doc", str(doc), "--max-tokens", "16", "--json",
            "What is the passkey of the storeroom? Answer with the number only.")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "5820417" in out["answer"]
    t = out["timings"]
    for field in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                  "predicted_per_second", "cache_n", "ttft_ms"):
        assert field in t
    assert t["prompt_n"] == out["prompt_tokens"] > 300


def test_chat_prints_answer_and_timings_table(tmp_path):
    doc = tmp_path / "d.md"
    doc.write_text("# Notes\n\nThe sky is blue today.")
    r = cli("chat", "--doc", str(doc), "--max-tokens", "8", "What colour is the sky?")
    assert r.returncode == 0, r.stderr
    assert "time to first token" in r.stdout and "tok/s" in r.stdout


@pytest.mark.parametrize("make, expect", [
    (lambda p: p / "missing.gguf", "not found"),
    (lambda p: (p / "text.gguf").write_text("not a model") and p / "text.gguf", "not a GGUF"),
    (lambda p: (p / "empty.gguf").write_bytes(b"GGUF" + b"\0" * 20) and p / "empty.gguf", "damaged or truncated"),
])
def test_bad_model_paths_exit_2_with_a_message(tmp_path, make, expect):
    r = cli("--model", str(make(tmp_path)), "chat", "Hello")
    assert r.returncode == 2
    assert expect in r.stderr and "Traceback" not in r.stderr


def test_the_shared_options_work_before_and_after_the_command(tmp_path):
    """`tune --model M` (as the docs write it) means the same as `--model M tune`."""
    missing = str(tmp_path / "elsewhere.gguf")
    for args in (("--model", missing, "info"), ("info", "--model", missing)):
        r = cli(*args)
        assert r.returncode == 2 and "elsewhere.gguf" in r.stderr and "not found" in r.stderr, (args, r.stderr)
    r = cli("--threads", "3", "info", "--json")  # an option before the command is not reset by the command
    assert r.returncode == 0 and json.loads(r.stdout)["threads"] == 3, r.stderr


def test_empty_document_exits_2(tmp_path):
    doc = tmp_path / "empty.txt"
    doc.write_text("  \n\n ")
    r = cli("chat", "--doc", str(doc), "What does it say?")
    assert r.returncode == 2 and "empty" in r.stderr


def test_missing_document_exits_2(tmp_path):
    r = cli("chat", "--doc", str(tmp_path / "nope.txt"), "What does it say?")
    assert r.returncode == 2 and "not found" in r.stderr


def test_random_bytes_as_a_document_exit_2_with_the_reason(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_bytes(os.urandom(3000))
    r = cli("chat", "--doc", str(doc), "What does it say?")
    assert r.returncode == 2 and "does not look like text" in r.stderr and "Traceback" not in r.stderr


def test_too_long_document_says_its_size_and_the_limit(tmp_path):
    doc = tmp_path / "long.txt"
    doc.write_text("The grass is green and the sky is blue. " * 600)
    r = cli("--ctx", "2048", "chat", "--doc", str(doc), "Summarise.")
    assert r.returncode == 2, r.stdout
    assert "tokens" in r.stderr and "2,048" in r.stderr and "Traceback" not in r.stderr


def test_headless_run_falls_back_to_the_demo():
    env_free = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    r = subprocess.run([sys.executable, "-m", "app", "run", "--tokens", "600"], cwd=ROOT,
                       env={**env_free, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "headless demo" in r.stdout
    # a 600-token window of the real document around its answer, on the small model: each reply is scored
    assert "valgrind-faq.txt" in r.stdout and "the answer is" in r.stdout
    # 600 tokens are too few for RidgeFill: it says it ran exact, and why (the timings' note)
    assert "RidgeFill (ran exact, see below) answers (" in r.stdout and "Exact model answers (" in r.stdout
    assert "nothing to win" in r.stdout
    assert "Time to first token: RidgeFill" in r.stdout


def test_chat_check_prints_exacts_verdict_on_the_ridgefill_answer():
    doc = ROOT / "backend" / "data" / "questions" / "realqa-xz-faq-part1.txt"
    r = cli("chat", "--check", "--no-cache", "--mode", "speed", "--tail", "64", "--doc", str(doc), "--max-tokens", "16",
            "--json", "Which file format does xz use by default?", timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    check = out["check"]
    assert out["timings"]["bulk_n"] > 0 and check["shown_answer"] == out["answer"]
    same = " ".join(check["exact_answer"].split()) == " ".join(out["answer"].split()) or check["dnll"] <= 0.05
    assert check["verdict"] in ("checked", "corrected") and (check["verdict"] == "checked") == same
    assert check["after_question_s"] >= check["seconds"] > 0 and out["document"]["exact_rows"] == out["document"]["tokens"]
    plain = cli("chat", "--check", "--no-cache", "--mode", "off", "--doc", str(doc), "--max-tokens", "4", "Hi?")
    assert plain.returncode == 0 and "Check: nothing to check (it ran exact)." in plain.stdout
