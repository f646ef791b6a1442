"""The app as a client of a remote engine (app/remote_engine.py, `chat --server`), against real servers on
loopback: this app's `serve` in a second process (RidgeFill mode per request, its timings, sources mapped back
to the documents and their pages) and llama.cpp's own server (llama_cpp.server: no RidgeFill, no sources,
nothing faked), through the official openai client; and every remote error a person can meet, each with a
message that names the server and says what to do, the text that had arrived kept."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")

from app.cli import run_cli  # noqa: E402
from app.remote_engine import RemoteEngine, RemoteError, api_base  # noqa: E402
from backend.documents import DocumentText, document_messages  # noqa: E402
from backend.protocol import CompletionRequest, TokenEvent  # noqa: E402
from backend.sampling import GREEDY  # noqa: E402
from tests.remote_servers import KEY, FaultServer, free_port, start_llama, start_ours  # noqa: E402

FILLER = " ".join(f"Day {d} of the island survey: the team walked the {w} shore and logged the tide at {d + 5} "
                  f"o'clock." for d, w in zip(range(1, 31), ["north", "south", "east", "west"] * 8))
# Long enough for RidgeFill to run (1,024 rows before its exact tail, else the prompt is prefilled exactly)
PAGE1 = f"Notes from the island survey, first page. The old pier is 140 metres long. {FILLER}\n"
PAGE2 = f"Second page. {FILLER} The lighthouse keeper's cat is named Biscuit. The keeper walks on Sundays.\n"
DOC = DocumentText("survey.pdf", PAGE1 + PAGE2, (0, len(PAGE1)))
QUESTION = "What is the cat's name?"


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    p = start_ours(tmp_path_factory.mktemp("ours"))
    yield p
    p.stop()


@pytest.fixture(scope="module")
def llama(tmp_path_factory, model_path):
    p = start_llama(tmp_path_factory.mktemp("llama"), model_path)
    yield p
    p.stop()


def ask(mode: str | None = "off", doc: DocumentText = DOC, max_tokens: int = 12) -> CompletionRequest:
    return CompletionRequest(messages=document_messages([doc], QUESTION), max_tokens=max_tokens, mode=mode,
                             sampling=GREEDY, documents=[doc])


def test_the_address_a_person_types_becomes_the_api_base():
    assert api_base("192.168.1.20:8080") == "http://192.168.1.20:8080/v1"
    assert api_base(" https://llm.example.org/v1/ ") == "https://llm.example.org/v1"
    with pytest.raises(RemoteError, match="not a server address"):
        api_base("ftp://host")


def test_our_server_answers_with_the_mode_asked_its_timings_and_sources_with_pages(ours):
    engine = RemoteEngine(ours.url, KEY)
    info = engine.probe()
    assert info.ours and info.models == [engine.model] and info.meta["n_layer"] == 30
    events: list = []
    res = engine.complete(ask("speed"), on_event=events.append)
    assert res.text and res.finish_reason in ("stop", "length")
    assert [e.text for e in events if isinstance(e, TokenEvent)] and "".join(e.text for e in events) == res.text
    server = res.extra["server"]
    assert server["mode"] == "speed" and server["bulk_n"] > 0 and res.timings.mode == "speed"
    assert server["prompt_n"] > 0 and res.timings.prompt_ms == server["prompt_ms"]
    assert res.timings.ttft_ms >= server["ttft_ms"] > 0  # the client's wait holds the server's
    assert res.extra["engine"] == f"{engine.model} at {ours.url}"
    assert res.sources, "our server sends sources"
    for s in res.sources:  # mapped back from "messages[0]" offsets into the document and its pages
        assert s.document == "survey.pdf" and s.page == DOC.page_at(s.start) and 0 <= s.start < s.end <= len(DOC.text)
    assert {" ".join(s.text.split()) for s in res.sources} == {" ".join(DOC.text[s.start:s.end].split())
                                                               for s in res.sources}  # the passages are there
    exact = engine.complete(ask("off"))  # the same server, exact this time: the mode goes with each request
    assert exact.extra["server"]["mode"] == "off" and exact.extra["server"]["bulk_n"] == 0


def test_llama_cpp_server_answers_without_ridgefill_or_sources(llama):
    engine = RemoteEngine(llama.url)
    info = engine.probe()
    assert not info.ours and info.models
    assert "ridgefill" not in engine.body(ask("speed"))["extra_body"]  # not sent where it means nothing
    res = engine.complete(ask("speed"))
    assert res.text and res.timings.ttft_ms > 0 and res.timings.predicted_n > 0
    assert res.sources == [] and "no sources" in res.extra["sources_note"]
    assert res.timings.mode == "off" and res.timings.bulk_n == 0  # no RidgeFill claimed for it


def test_a_stop_returns_what_arrived(ours):
    engine = RemoteEngine(ours.url, KEY)
    seen: list = []
    cut: list = []
    res = engine.complete(CompletionRequest(messages=document_messages([DOC], "Tell a long story about the "
                                                                        "island."), max_tokens=400, mode="off"),
                          on_event=seen.append, cancelled=lambda: len(seen) >= 3, on_cancel=cut.append)
    assert res.finish_reason == "cancelled" and res.text == "".join(e.text for e in seen[:3])
    assert cut, "a stop can cut the stream at once"


def test_cli_chat_against_our_server_and_llama_cpp(ours, llama, tmp_path, capsys):
    doc = tmp_path / "survey.txt"
    doc.write_text(PAGE1 + PAGE2)
    argv = ["chat", "--doc", str(doc), "--max-tokens", "12", "--greedy", "--json", QUESTION]
    assert run_cli(argv[:1] + ["--server", ours.url, "--api-key", KEY, "--mode", "speed"] + argv[1:]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ridgefill_server"] and out["answer"] and out["engine"].endswith(ours.url)
    assert out["timings"]["ttft_ms"] > 0 and out["server_timings"]["mode"] == "speed"
    assert out["sources"] and {s["document"] for s in out["sources"]} == {"survey.txt"}
    assert run_cli(argv[:1] + ["--server", llama.url] + argv[1:-2] + [QUESTION]) == 0  # not JSON: lines
    out = capsys.readouterr().out
    assert "time to first token" in out and "measured here" in out and llama.url in out
    assert "RidgeFill, sources" in out and "not available from this server" in out


def error_of(engine: RemoteEngine, request: CompletionRequest | None = None) -> str:
    with pytest.raises(RemoteError) as err:
        engine.complete(request or ask(None))
    return str(err.value)


def test_remote_errors_name_the_server_and_say_what_to_do(ours, capsys):
    msg = error_of(RemoteEngine(ours.url, "wrong-key"))
    assert "401" in msg and ours.url in msg and "Check the key" in msg
    msg = error_of(RemoteEngine(ours.url, KEY, "no-such-model"))
    assert "404" in msg and "no-such-model" in msg and "choose one of them" in msg
    long_doc = DocumentText("long.txt", "The survey found nothing of note on this stretch of the coast. " * 600)
    msg = error_of(RemoteEngine(ours.url, KEY), ask(None, long_doc))
    assert "do not fit the context" in msg and ours.url in msg and "Attach less text" in msg
    closed = f"http://127.0.0.1:{free_port()}"
    msg = error_of(RemoteEngine(closed))
    assert msg.startswith(f"Cannot reach the server {closed}") and "that the server is running" in msg
    assert run_cli(["chat", "--server", closed, "hello"]) == 2  # the CLI says it in one line, no traceback
    assert capsys.readouterr().err.startswith(f"error: Cannot reach the server {closed}")


@pytest.mark.parametrize("fault, said", [
    ("429", "is busy (429: Rate limit reached). Wait 7 s and send the question again."),
    ("drop", "dropped while answering (10 characters had arrived; they are kept)"),
    ("unfinished", "ended the answer before finishing it (10 characters arrived and are kept)"),
    ("stall", "sent nothing for 1 s while answering (10 characters had arrived; they are kept)"),
])
def test_faults_a_real_server_will_not_make_on_demand(fault, said):
    srv = FaultServer(fault)
    try:
        engine = RemoteEngine(srv.url, read_timeout_s=1)
        got: list = []
        with pytest.raises(RemoteError) as err:
            engine.complete(ask("speed"), on_event=got.append)
        assert srv.url in str(err.value) and said in str(err.value)
        assert "".join(e.text for e in got) == ("" if fault == "429" else "The cat is")
        body = srv.requests[0]  # not this app's server: no RidgeFill options, no llama.cpp DRY fields
        assert "ridgefill" not in body and "dry_multiplier" not in body and body["top_k"] == 0
    finally:
        srv.stop()
