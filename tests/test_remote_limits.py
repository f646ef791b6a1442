"""The remote client's limits and errors (issue 65, item 3), against real loopback servers: an answer, a
chunk, the model list, a model id and the sources past their limits; bad JSON, HTML, a value of the wrong
type and a body cut short, each a RemoteError naming the server with a quote of what it sent; a stop before
the headers arrive; plain http to another machine said; credentials never kept in an address; the key from
the environment; the job queue bounded."""
from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from app import remote_engine, remote_reply, remote_servers, remote_wire
from app.cli import run_cli
from app.job_runner import MAX_QUEUED_EVENTS, JobRunner
from app.remote_engine import RemoteEngine, RemoteError, RemoteSource
from app.engine_protocol import TaskCancelled, TaskEvent, TaskKind
from app.remote_wire import plain_http_warning
from backend.protocol import ChatMessage, CompletionRequest

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "someone"}]}
OURS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "ridgefill-desktop"}]}


def sse(*chunks) -> bytes:
    return b"".join(b"data: " + (c if isinstance(c, bytes) else json.dumps(c).encode()) + b"\n\n" for c in chunks)


def piece(text: str, finish=None, **extra) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}], **extra}


class Server:
    """A loopback server: GET answers `models`, POST answers `chat` (bytes, status, content type), or
    `delay_s` of silence before any header. It records each request's Authorization header."""

    def __init__(self, chat: bytes = sse(piece("Hi", "stop")), *, models=MODELS, status: int = 200,
                 kind: str = "text/event-stream", models_raw: bytes | None = None, length: int | None = None,
                 delay_s: float = 0.0):
        self.auth: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def send(self, status, kind, body, length=None):
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(length if length is not None else len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = True

            def do_GET(self):
                outer.auth.append(self.headers.get("Authorization", ""))
                raw = models_raw if models_raw is not None else json.dumps(models).encode()
                self.send(200, "application/json", raw, length if models_raw is not None else None)

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.auth.append(self.headers.get("Authorization", ""))
                time.sleep(delay_s)
                try:
                    self.send(status, kind, chat)
                except OSError:
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


QUESTION = CompletionRequest(messages=[ChatMessage("user", "What is the cat's name?")], max_tokens=8)


def refusal(srv: Server, **engine) -> str:
    try:
        with pytest.raises(RemoteError) as err:
            RemoteEngine(srv.url, **engine).complete(QUESTION)
    finally:
        srv.stop()
    assert srv.url in str(err.value), str(err.value)
    return str(err.value)


def test_an_answer_past_its_limit_is_refused(monkeypatch):
    monkeypatch.setattr(remote_reply, "MAX_ANSWER_CHARS", 1000)
    msg = refusal(Server(sse(*[piece("x" * 100)] * 20, piece("", "stop"))))
    assert "an answer over 1,000 characters" in msg and "'xxxx" in msg


def test_a_chunk_past_its_limit_is_refused(monkeypatch):
    monkeypatch.setattr(remote_wire, "MAX_EVENT_BYTES", 10_000)
    assert "a chunk over" in refusal(Server(sse(piece("y" * 20_000, "stop"))))


def test_too_many_chunks_are_refused(monkeypatch):
    monkeypatch.setattr(remote_reply, "MAX_EVENTS", 50)
    assert "over 50 chunks" in refusal(Server(sse(*[{"choices": []}] * 60, piece("a", "stop"))))


def test_a_model_list_past_its_limits_is_refused(monkeypatch):
    monkeypatch.setattr(remote_reply, "MAX_MODELS", 3)
    many = {"data": [{"id": f"m{i}"} for i in range(4)]}
    assert "a list of 4 models (this app reads at most 3)" in refusal(Server(models=many))
    monkeypatch.setattr(remote_reply, "MAX_MODEL_ID_CHARS", 50)
    assert "a model id of 60 characters" in refusal(Server(models={"data": [{"id": "i" * 60}]}))
    monkeypatch.setattr(remote_engine, "MAX_MODELS_BYTES", 1000)
    assert "its model list over 1,000 bytes" in refusal(Server(models={"data": [{"id": "m", "pad": "p" * 2000}]}))


def test_sources_past_their_limits_are_refused(monkeypatch):
    monkeypatch.setattr(remote_reply, "MAX_SOURCES", 2)
    src = {"document": "messages[0]", "start": 0, "end": 3, "text": "The", "score": 0.5}
    assert "3 sources (this app takes at most 2)" in refusal(Server(sse(piece("A", "stop", sources=[src] * 3)),
                                                                  models=OURS))
    monkeypatch.setattr(remote_reply, "MAX_SOURCE_CHARS", 10)
    long_src = {**src, "text": "t" * 11}
    assert "a source of 11 characters" in refusal(Server(sse(piece("A", "stop", sources=[long_src])), models=OURS))


@pytest.mark.parametrize("server, said", [
    (lambda: Server(sse(b'{"choices": [{"delta": {"content": "Hi"')), "a chunk that is not JSON: '{\"choices\""),
    (lambda: Server(b"<html><body>Login</body></html>", kind="text/html"),
     "text/html, not an event stream: '<html><body>Login</body></html>'"),
    (lambda: Server(sse(piece(5, "stop"))), 'a delta whose "content" is int, not str'),
    (lambda: Server(sse({"choices": "none"})), 'a chunk whose "choices" is str, not list'),
    (lambda: Server(sse([1, 2])), "a chunk that is not a JSON object: '[1, 2]'"),
    (lambda: Server(models_raw=b"<html>Welcome to nginx</html>"), "a model list that is not JSON: '<html>Welcome"),
    (lambda: Server(models={"data": "m"}), "a model list with no \"data\" list"),
    (lambda: Server(models={"data": [{"id": 7}]}), "a model entry with no id: '{\"id\": 7}'"),
    (lambda: Server(models_raw=b'{"data": [{"id": "m"', length=500), "cut its reply short while reading its models "
                                                                      "(20 bytes arrived: '{\"data\": [{\"id\": \"m\"')"),
    (lambda: Server(b"<h1>Bad Gateway</h1>", status=502, kind="text/html"), "(502: '<h1>Bad Gateway</h1>')"),
    (lambda: Server(sse(piece("A", "stop", timings={"prompt_n": "many", "mode": 3}))), None),
])
def test_a_reply_this_app_cannot_read_names_the_server_and_quotes_it(server, said):
    srv = server()
    if said is None:  # timings of the wrong types are left out; the answer stands
        try:
            res = RemoteEngine(srv.url).complete(QUESTION)
        finally:
            srv.stop()
        assert res.text == "A" and "prompt_n" not in res.extra["server"] and res.timings.prompt_n == 0
        return
    assert said in refusal(srv)


def test_a_stop_returns_before_the_headers_arrive():
    srv = Server(delay_s=30)
    try:
        t0 = time.monotonic()
        res = RemoteEngine(srv.url).complete(QUESTION, cancelled=lambda: time.monotonic() - t0 > 0.3)
        assert res.finish_reason == "cancelled" and res.text == ""
        assert time.monotonic() - t0 < 3, "the stop waited for the headers"
        source = RemoteSource(RemoteEngine(srv.url))  # the GUI's way: a task, cancelled
        task = source.submit(TaskKind.COMPLETE, QUESTION)
        time.sleep(0.3)
        t1 = time.monotonic()
        source.cancel(task)
        ended: list = []
        while not ended and time.monotonic() - t1 < 3:
            ended = [m for m in source.poll() if not isinstance(m, TaskEvent)]
            time.sleep(0.02)
        assert ended and isinstance(ended[0], TaskCancelled) or getattr(ended[0], "result", None).finish_reason \
            == "cancelled", ended
        source.shutdown(1)
    finally:
        srv.stop()


def test_plain_http_to_another_machine_is_warned(caplog, capsys):
    for here in ("http://127.0.0.1:8080/v1", "http://localhost:8080/v1", "http://[::1]:8080/v1",
                 "https://llm.example.org/v1"):
        assert plain_http_warning(here) == ""
    assert "plain http" in plain_http_warning("http://192.168.1.20:8080/v1")
    with caplog.at_level(logging.WARNING):
        RemoteEngine("192.168.1.20:8080")
    assert "192.168.1.20 is reached over plain http" in caplog.text
    with caplog.at_level(logging.WARNING):  # the log record, not stderr: an earlier test's handler may hold a closed stream
        assert run_cli(["chat", "--server", "http://0.0.0.0:9", "hello"]) == 2  # not reached; warned first
    assert "0.0.0.0 is reached over plain http" in caplog.text


def test_the_add_server_dialog_says_where_the_text_goes_and_warns_of_plain_http(qtbot):
    from ui.engine_picker import SENT_NOTE, AddServerDialog

    dlg = AddServerDialog()
    qtbot.addWidget(dlg)
    assert dlg.sent_note.text() == SENT_NOTE and "documents" in SENT_NOTE and "sent to this server" in SENT_NOTE
    dlg.url.setText("http://192.168.1.20:8080")
    assert not dlg.http_warning.isHidden() and "plain http" in dlg.http_warning.text()
    dlg.url.setText("https://192.168.1.20:8080")
    assert dlg.http_warning.isHidden()


def test_credentials_in_an_address_are_used_as_the_key_and_kept_nowhere_else(qtbot, tmp_path, monkeypatch):
    from ui.engine_picker import AddServerDialog

    srv = Server(sse(piece("Hi", "stop")))
    try:
        with_creds = srv.url.replace("http://", "http://user:s3cret@")
        engine = RemoteEngine(with_creds)
        res = engine.complete(QUESTION)
        assert srv.auth == ["Bearer s3cret"] * 2 and engine.url == srv.url + "/v1"
        assert "s3cret" not in json.dumps(res.extra) and "user" not in engine.name
        monkeypatch.setattr(remote_servers, "servers_path", lambda: tmp_path / "servers.json")
        dlg = AddServerDialog()
        qtbot.addWidget(dlg)
        dlg.url.setText(with_creds)
        dlg.read_btn.click()
        qtbot.waitUntil(lambda: dlg.models.count() > 0, timeout=10_000)
        server = dlg.server()
        assert (server.url, server.api_key) == (srv.url + "/v1", "s3cret")
        remote_servers.add_server(remote_servers.RemoteServer(with_creds + "/v1", "old", ""))  # an older entry
        saved = json.loads((tmp_path / "servers.json").read_text())["servers"]
        assert [(s["url"], s["api_key"]) for s in saved] == [(srv.url + "/v1", "s3cret")]
        (tmp_path / "servers.json").write_text(json.dumps({"servers": [{"url": with_creds, "model": "m"}]}))
        assert [(s.url, s.api_key) for s in remote_servers.load_servers()] == [(srv.url, "s3cret")]
        with pytest.raises(RemoteError) as err:
            RemoteEngine(with_creds.replace("127.0.0.1", "127.0.0.1:notaport"))
        assert "s3cret" not in str(err.value)
    finally:
        srv.stop()


def test_chat_takes_the_key_from_the_environment(monkeypatch, capsys):
    srv = Server(sse(piece("Hi", "stop")))
    try:
        monkeypatch.setenv("RIDGEFILL_API_KEY", "from-env")
        assert run_cli(["chat", "--server", srv.url, "--json", "hello"]) == 0
        assert srv.auth == ["Bearer from-env"] * 2 and json.loads(capsys.readouterr().out)["answer"] == "Hi"
        assert run_cli(["chat", "--server", srv.url, "--api-key", "given", "--json", "hello"]) == 0
        assert srv.auth[2:] == ["Bearer given"] * 2  # the flag, where given, wins
    finally:
        srv.stop()


def test_the_job_queue_holds_a_bounded_number_of_events():
    runner = JobRunner("bounded")
    sent = MAX_QUEUED_EVENTS * 3
    job = runner.submit("flood", lambda ctx: [ctx.emit(i) for i in range(sent)] and "done")
    time.sleep(0.5)  # nobody polls: the job waits once the queue is full
    assert runner._messages.qsize() == MAX_QUEUED_EVENTS
    got: list = []
    while len(got) < sent + 1:
        got += runner.poll()
    assert [m.event for m in got[:-1]] == list(range(sent)) and got[-1].result == "done"
    stuck = runner.submit("stuck", lambda ctx: [ctx.emit(i) for i in range(sent)])
    time.sleep(0.3)
    runner.cancel(stuck)  # a job waiting for room ends when cancelled
    deadline = time.monotonic() + 3
    while runner.busy and time.monotonic() < deadline:
        runner.poll()
    assert not runner.busy and job not in runner.tasks
