"""A model whose split is a guess (never tuned, not in the defaults' table) is said to be "untuned" by `chat`
and by the server's /v1/models, and no longer once a tuned record exists; a record that chose exact is said
plainly. The tiny test model is such a model."""
from __future__ import annotations

import argparse
import json
import urllib.request

import pytest

from app.model_tuning import model_tuning, tuned_line, untuned_note_of_file, untuned_note_of_ready
from backend.model_file import read_model_header
from backend.ridgefill.tuned import EXACT_SUMMARY, summary, write_tuned
from tests.tiny_gguf import write_tiny_gguf

GUESS = "untuned: split 3 is a guess (two thirds of the layers), measured on no document"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", "llama", n_layer=4))


def record(split=2, mode="guided") -> dict:
    return {"split": split, "tail": 64, "mode": mode, "chosen_by": "test"}


def test_the_note_is_said_until_a_record_exists_and_a_record_of_exact_is_said_plainly(tiny):
    info = read_model_header(tiny)
    assert model_tuning(info)[1].startswith(GUESS) and untuned_note_of_file(tiny).startswith(GUESS)
    assert untuned_note_of_file("") == "" and untuned_note_of_file(tiny + ".missing") == ""
    write_tuned(info, record(mode="off"))
    assert model_tuning(info) == (EXACT_SUMMARY, "") and untuned_note_of_file(tiny) == ""
    assert tuned_line(None) == "" and tuned_line(record()) == summary(record())


def test_an_engine_ready_says_untuned_while_the_engine_found_no_record(model_path):
    from types import SimpleNamespace

    ready = SimpleNamespace(architecture="llama", n_layer=4, n_embd=64, tuned="")
    assert untuned_note_of_ready(ready).startswith(GUESS)
    assert untuned_note_of_ready(SimpleNamespace(**{**vars(ready), "tuned": "S = 2: test"})) == ""
    smollm2 = read_model_header(model_path)  # in the measured table
    assert untuned_note_of_ready(SimpleNamespace(architecture=smollm2.architecture, n_layer=smollm2.n_layer,
                                                 n_embd=smollm2.n_embd, tuned="")) == ""


def chat(argv: list[str]) -> int:
    """`python -m app chat ...` in this process (only the chat command is registered)."""
    from app.cli import add_commands, add_common

    parser = argparse.ArgumentParser()
    add_common(parser)
    add_commands(parser.add_subparsers(dest="command"), ["app.commands.chat"])
    args = parser.parse_args(argv)
    return args.func(args)


def test_chat_says_untuned_beside_the_timings_until_the_model_is_tuned(tiny, capsys):
    argv = ["--model", tiny, "--ctx", "512", "chat", "--max-tokens", "2", "--no-cache", "Hello"]
    assert chat(argv) == 0
    out = capsys.readouterr().out
    assert "time to first token" in out and out.count("untuned: split 3 is a guess") == 1, out
    assert chat(argv[:4] + ["chat", "--split", "2", *argv[5:]]) == 0  # a split the person chose is theirs
    assert "untuned" not in capsys.readouterr().out
    assert chat(argv[:5] + ["--json", *argv[5:]]) == 0
    assert json.loads(capsys.readouterr().out)["untuned"].startswith(GUESS)
    write_tuned(read_model_header(tiny), record())
    assert chat(argv) == 0
    assert "untuned" not in capsys.readouterr().out


def test_the_untuned_row_is_not_said_twice():
    from types import SimpleNamespace

    from app.commands.chat import untuned_row
    from backend.ridgefill.defaults import guess_note

    info = SimpleNamespace(architecture="llama", n_layer=4, n_embd=64, name="x")  # no record can match it
    assert untuned_row(info, None, "").strip().startswith("tuning") and GUESS in untuned_row(info, None, "")
    assert untuned_row(info, None, f"some other note {guess_note(info)}") == ""  # RidgeFill ran at the guess
    assert untuned_row(info, 2, "") == ""


def test_the_models_list_says_untuned_until_the_model_is_tuned(tiny):
    from app.engine_protocol import EngineSettings
    from app.server.gateway import ProcessGateway
    from app.server.runner import LocalServer
    from app.server.schema import Defaults

    gateway = ProcessGateway(EngineSettings(tiny, n_ctx=512, n_batch=128, n_threads=1, warm_up=False)).start()
    server = None
    try:
        gateway.wait_ready()
        server = LocalServer(gateway, defaults=Defaults(), port=0).start()

        def meta() -> dict:
            with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
                return json.load(r)["data"][0]["meta"]

        assert meta()["untuned"].startswith(GUESS)
        write_tuned(read_model_header(tiny), record())
        assert "untuned" not in meta() and meta()["n_layer"] == 4
    finally:
        if server is not None:
            server.stop()
        gateway.close()


def test_a_measured_default_that_departs_is_said_until_the_user_tunes(model_path):
    """SmolLM2's table default was judged by fidelity and departs (docs/TUNE.md): its RidgeFill answers say
    so; a record of the user's own tune replaces the table, and the note goes."""
    from backend.ridgefill.defaults import default_note, departure_note, split_is_guess

    info = read_model_header(model_path)
    assert not split_is_guess(info) and departure_note(info).startswith("measured: RidgeFill moves")
    assert default_note(info) == departure_note(info)  # what a RidgeFill answer at the default says
    write_tuned(info, record(split=18, mode="guided"))
    assert departure_note(info) == "" and default_note(info) == ""


def test_a_record_whose_yardstick_moved_nothing_is_strict_json_and_said(tiny):
    """q8_0 moved no reply on a document (|ΔNLL| 0): the ratio to it is infinite, which JSON cannot hold
    (Python wrote Infinity); the record keeps it as null and the panel's line says what it means."""
    from backend.ridgefill.tuned import tuned_path

    info = read_model_header(tiny)
    docs = [{"document": "a.txt", "ratio": 0.5}, {"document": "b.txt", "ratio": float("inf")}]
    write_tuned(info, {**record(split=2, mode="speed"),
                       "candidates": [{"setting": "speed:2", "ratio": 1.5, "documents": docs}]})

    def refuse(name):
        raise ValueError(f"{name} in the record")

    rec = json.loads(tuned_path(info).read_text(), parse_constant=refuse)
    assert rec["candidates"][0]["documents"][1]["ratio"] is None
    assert "b.txt beyond q8_0's (which moved nothing there)" in summary(rec)
