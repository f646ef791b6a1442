"""The lab beside the product: `python -m lab` runs the commands that moved out of the app, with the same
arguments; `python -m app` asked for one of them imports nothing of the lab, says where the command went and
exits 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import build_parser as app_parser, run_cli as app_cli
from app.moved_commands import LAB_CACHE_ACTIONS, LAB_COMMANDS, moved_command
from lab.cli import build_parser as lab_parser

ROOT = Path(__file__).resolve().parents[1]


def _choices(parser) -> dict:
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sub.choices


def _actions(parser) -> set[str]:
    (sub,) = [a for a in parser._actions if a.dest == "cache_action"]
    return set(sub.choices)


NEVER_THE_APPS = {"fuzz-remote", "fuzz-configs"}  # lab commands born in the lab: nothing to say "moved" about


def test_the_app_and_the_lab_agree_on_what_moved():
    lab, app = _choices(lab_parser()), _choices(app_parser())
    assert set(lab) == set(LAB_COMMANDS) | {"cache"} | NEVER_THE_APPS
    assert not NEVER_THE_APPS & set(app)
    assert _actions(lab["cache"]) == set(LAB_CACHE_ACTIONS)
    assert not set(LAB_COMMANDS) & set(app)
    assert not _actions(app["cache"]) & set(LAB_CACHE_ACTIONS)


@pytest.mark.parametrize("argv, moved", [
    (["recall", "--out", "r.jsonl"], "recall"),
    (["--threads", "2", "--model", "m.gguf", "-v", "fuzz-readers", "--examples", "5"], "fuzz-readers"),
    (["--ctx=2048", "serve-load"], "serve-load"),
    (["--model", "m.gguf", "cache", "bench", "--tokens", "6000"], "cache bench"),
    (["cache", "list"], None),
    (["--model", "recall", "chat", "hello"], None),  # a model file named like a command
    (["chat", "--doc", "x.txt", "recall"], None),  # a question that is a command's name
    ([], None),
])
def test_a_moved_command_is_found_among_the_common_options(argv, moved):
    assert moved_command(argv) == moved


def test_the_app_says_where_a_moved_command_went(capsys):
    argv = ["--threads", "2", "recall", "--haystack", "realqa", "--out", "my results.jsonl"]
    assert app_cli(argv) == 2
    err = capsys.readouterr().err
    assert "python -m lab --threads 2 recall --haystack realqa --out 'my results.jsonl'" in err
    assert app_cli(["cache", "bench", "--tokens", "6000"]) == 2
    assert "python -m lab cache bench --tokens 6000" in capsys.readouterr().err


def test_the_app_imports_nothing_of_the_lab():
    """In a fresh interpreter: every app command registered, a moved command asked for, no lab module loaded."""
    code = ("import sys; from app.cli import build_parser, run_cli; build_parser(); "
            "rc = run_cli(['bench', '--lengths', '100']); "
            "print(rc, sorted(m for m in sys.modules if m == 'lab' or m.startswith('lab.')))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "2 []"
    assert "python -m lab bench --lengths 100" in r.stderr


@pytest.mark.parametrize("argv", [["--threads", "3", "recall", "--out", "r.jsonl"],
                                  ["recall", "--out", "r.jsonl", "--threads", "3"]])
def test_the_lab_takes_the_common_options_before_or_after_the_command(argv):
    args = lab_parser().parse_args(argv)
    assert args.threads == 3 and args.command == "recall" and args.model is None


def test_python_m_lab_runs_a_command_and_its_errors_exit_2(tmp_path):
    help_text = subprocess.run([sys.executable, "-m", "lab", "--help"], cwd=ROOT, capture_output=True, text=True,
                               timeout=120).stdout
    for command in LAB_COMMANDS:
        assert command in help_text
    r = subprocess.run([sys.executable, "-m", "lab", "compare", str(tmp_path / "missing.jsonl")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "does not exist" in r.stderr
