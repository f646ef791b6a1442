"""Hostile and unlucky inputs to the OpenAI-compatible server (issue 39), in-process with a fake engine:
size-like sampling fields bounded, NaN and deep nesting refused, JSON only, Host and Origin allow-lists,
the queue checked before the body, deadlines for a stuck engine; and the engine process's reader when
its child dies in the middle of a message."""
from __future__ import annotations

import http.client
import json
import os
import struct
import threading
import time
from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from app.engine_protocol import EngineFatal, EngineSettings, TaskDone, TaskEvent, TaskFailed, TaskKind
from app.server.api import ApiServer
from app.server.schema import ApiError, Defaults, decode_body, parse_request
from app.task_stream import Task as Ticket  # the gateway's task, as the fakes name it
from backend.protocol import CompletionResult, Timings, TokenEvent
from backend.sampling import GREEDY, MAX_WINDOW

URL = "http://127.0.0.1:8080"
INFO = SimpleNamespace(model_path="/models/tiny.gguf", model_name="tiny", n_layer=30, sampling=())
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


class FakeGateway:
    """An engine that answers at once ("answer"), never ("hang"), says one token and goes silent ("stall"),
    answers at once at length ("long": 20,000 tokens, some 3 MB of events), or refuses the prompt as too long
    and then never counts it ("too long")."""

    state, problem, document = "ready", "", None

    def __init__(self, behaviour: str = "answer"):
        self.info = INFO
        self.behaviour = behaviour
        self.submitted = 0

    def submit(self, kind, payload, deliver) -> Ticket:
        self.submitted += 1
        ticket = Ticket(kind, payload, deliver)
        ticket.task_id = self.submitted
        if self.behaviour == "too long" and kind != TaskKind.COUNT:  # and the count never answers
            deliver(TaskFailed(ticket.task_id, "DocumentTooLongError", "The prompt is too long."))
        if self.behaviour in ("answer", "stall"):
            deliver(TaskEvent(ticket.task_id, TokenEvent(1, "Hi")))
        if self.behaviour == "answer":
            deliver(TaskDone(ticket.task_id, CompletionResult("Hi", "stop", Timings(predicted_n=1), 3)))
        if self.behaviour == "long":
            for i in range(20_000):
                deliver(TaskEvent(ticket.task_id, TokenEvent(i, " word")))
            deliver(TaskDone(ticket.task_id, CompletionResult(" word" * 20_000, "length", Timings(predicted_n=20_000), 3)))
        return ticket

    def cancel(self, ticket) -> None:  # a stuck engine does not answer a cancel either
        pass


def client(behaviour="answer", **kw) -> TestClient:
    api = ApiServer(FakeGateway(behaviour), defaults=Defaults("off", sampling=GREEDY), **kw)
    return TestClient(api.app, base_url=URL, raise_server_exceptions=False)


def parse(body: dict, chat: bool = False):
    return parse_request({"prompt": "x", **body} if not chat else body, chat=chat, defaults=Defaults("off"),
                         n_layer=30)


# ---- the parsing layer ------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value", [
    ("dry_penalty_last_n", 2_147_483_647), ("repeat_last_n", 300_000_000), ("repeat_last_n", MAX_WINDOW + 1),
    ("dry_allowed_length", 10**12), ("top_k", 2**31), ("max_tokens", 10**30), ("max_completion_tokens", 2**63),
])
def test_a_size_like_field_beyond_its_bound_gets_400(field, value):
    with pytest.raises(ApiError) as e:
        parse({field: value})
    assert e.value.status == 400 and e.value.body["error"]["param"] == field
    assert f"{value!r}"[:20] in e.value.body["error"]["message"]
    assert parse({field: MAX_WINDOW if "last_n" in field else 64}).request  # within the bound: accepted


def test_a_huge_tail_or_stop_sequence_gets_400():
    for body, param in (({"ridgefill": {"tail": 10**9}}, "tail"), ({"stop": ["x" * 10_000]}, "stop")):
        with pytest.raises(ApiError) as e:
            parse(body)
        assert e.value.status == 400 and e.value.body["error"]["param"] == param


@pytest.mark.parametrize("raw", [b'{"prompt": "x", "temperature": NaN}', b'{"prompt": "x", "top_p": Infinity}',
                                 b'{"prompt": "x", "min_p": -Infinity}', b'{"prompt": "x", "temperature": 1e999}'])
def test_nan_and_infinity_get_400(raw):
    with pytest.raises(ApiError) as e:
        parse_request(decode_body(raw), chat=False, defaults=Defaults("off"))
    assert e.value.status == 400 and e.value.body["error"]["code"] == "invalid_json"


def test_nan_given_directly_fails_the_range_check():
    with pytest.raises(ApiError) as e:
        parse({"temperature": float("nan")})
    assert e.value.body["error"]["param"] == "temperature"


def test_deep_nesting_gets_400_not_a_recursion_error():
    with pytest.raises(ApiError) as e:
        decode_body(b"[" * 100_000 + b"]" * 100_000)
    assert e.value.status == 400 and "nested too deeply" in e.value.body["error"]["message"]


@pytest.mark.parametrize("body", [
    {"messages": [{"role": ["user"], "content": "x"}]},  # unhashable: was a TypeError
    {"messages": [{"role": {}, "content": "x"}]},
    {"messages": [{"role": "user", "content": "x"}], "logprobs": []},  # was StopIteration in a coroutine
    {"messages": [{"role": "user", "content": "x"}], "ridgefill": {"mode": ["speed"]}},
])
def test_odd_types_get_400(body):
    with pytest.raises(ApiError) as e:
        parse(body, chat=True)
    assert e.value.status == 400


@pytest.mark.parametrize("body", [{"prompt": "ab\ud800"}, {"stop": ["\udc00"]}, {"dry_sequence_breakers": ["\ud800"]}])
def test_half_a_surrogate_pair_gets_400_not_a_500_from_the_tokenizer(body):
    raw = json.dumps(body).encode()  # JSON escapes it as \\ud800, which decodes to a lone surrogate
    with pytest.raises(ApiError) as e:
        parse(decode_body(raw))
    assert e.value.status == 400 and e.value.body["error"]["param"] == next(iter(body))


# ---- over HTTP, in-process -------------------------------------------------------------------------
def test_a_well_formed_request_is_answered():
    r = client().post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hi"


def test_an_unknown_model_named_with_half_a_surrogate_pair_gets_404_not_a_500():
    # the 404's message shows the name: raw, its JSON could not be encoded as UTF-8
    raw = json.dumps({**CHAT, "model": "gpt\ud800"}).encode()
    r = client().post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert "gpt\\ud800" in r.json()["error"]["message"]


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_not_sent_as_json_gets_415(ctype):
    headers = {"Content-Type": ctype} if ctype else {}
    r = client().post("/v1/chat/completions", content=json.dumps(CHAT).encode(), headers=headers)
    assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_nan_and_deep_nesting_over_http_get_400():
    c = client()
    for raw in (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', b"[" * 100_000):
        r = c.post("/v1/chat/completions", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_a_foreign_host_is_refused_and_loopback_names_pass():
    c = client()
    assert c.get("/health", headers={"Host": "attacker.example"}).status_code == 403
    r = c.post("/v1/chat/completions", json=CHAT, headers={"Host": "rebound.attacker.example:8080"})
    assert r.status_code == 403 and "--allowed-host" in r.json()["error"]["message"]
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert c.get("/health", headers={"Host": host}).status_code == 200, host
    allowed = client(hosts=["localhost", "gpu-box.lan"])
    assert allowed.get("/health", headers={"Host": "gpu-box.lan:8080"}).status_code == 200


def test_a_cross_origin_request_is_refused_unless_allowed():
    c = client()
    r = c.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://attacker.example"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert c.get("/v1/models", headers={"Origin": "null"}).status_code == 403
    assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # no Origin: not a browser page
    ok = client(origins=["http://localhost:3000"])
    r = ok.post("/v1/chat/completions", json=CHAT, headers={"Origin": "http://localhost:3000"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
    pre = ok.options("/v1/chat/completions", headers={"Origin": "http://localhost:3000",
                                                      "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 200


def test_a_body_over_the_limit_gets_413():
    r = client().post("/v1/completions", content=b" " * (8 * 1024 * 1024 + 1),
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_stuck_engine_gives_503_then_a_full_queue_answers_429_before_the_body():
    c = client("hang", max_queue=1, queue_timeout_s=0.3)
    t0 = time.monotonic()
    r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and r.json()["error"]["code"] == "queue_timeout" and time.monotonic() - t0 < 5
    # the stuck task still holds the only slot: the next request is turned away before its (too large) body,
    # as too many requests (the client may retry), not as a fault of the server
    r = c.post("/v1/completions", content=b" " * (9 * 1024 * 1024), headers={"Content-Type": "application/json"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full" and r.headers["Retry-After"] == "1"


def test_a_too_long_prompt_gets_its_400_even_when_the_engine_never_counts_it():
    r = client("too long", stall_timeout_s=0.3).post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "n_ctx" not in r.json()["error"]


def test_an_engine_that_goes_silent_mid_answer_gives_504_or_an_error_event():
    c = client("stall", stall_timeout_s=0.3)
    r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 504 and r.json()["error"]["code"] == "engine_timeout"
    r = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert r.status_code == 200 and events[-1]["error"]["code"] == "engine_timeout"


def test_the_real_server_checks_the_host_and_bounds_concurrency():
    from app.server.runner import MIN_CONCURRENCY, LocalServer

    srv = LocalServer(FakeGateway(), defaults=Defaults("off", sampling=GREEDY), port=0).start()
    try:
        assert srv._server.config.limit_concurrency == MIN_CONCURRENCY
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        for host, status in (("attacker.example", 403), (f"127.0.0.1:{srv.port}", 200)):
            conn.request("GET", "/health", headers={"Host": host})
            r = conn.getresponse()
            assert (r.status, bool(r.read())) == (status, True), host
    finally:
        srv.stop()


# ---- the engine process's reader ---------------------------------------------------------------------
def cut_child(settings, tasks, events, cancels):
    """A child that writes a message header promising 1,000 bytes, 10 of them, and dies."""
    events._sem.acquire()  # as Queue.put does
    os.write(events._writer.fileno(), struct.pack("!i", 1000) + b"x" * 10)
    os._exit(9)


def garbled_child(settings, tasks, events, cancels):
    """A child whose message is whole but does not unpickle, and which then lives on."""
    events._sem.acquire()  # as Queue.put does
    os.write(events._writer.fileno(), struct.pack("!i", 5) + b"\x80\x05junk")
    time.sleep(60)


@pytest.mark.parametrize("target, said", [(cut_child, "cut off"), (garbled_child, "could not be read")])
def test_a_child_that_breaks_a_message_is_an_engine_crash(monkeypatch, target, said):
    import app.engine_process as ep

    monkeypatch.setattr(ep, "child_main", target)
    proc = ep.EngineProcess(EngineSettings("none.gguf"), auto_restart=False)
    proc.start()
    got: list = []

    def read():
        deadline = time.monotonic() + 20
        while not got and time.monotonic() < deadline:
            try:
                got.extend(m for m in proc.poll() if isinstance(m, EngineFatal))
            except Exception as exc:  # noqa: BLE001 - the defect: the reader raised
                got.append(exc)
            time.sleep(0.02)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(25)
    assert not reader.is_alive(), "the parent's reader is blocked on the cut message"
    assert got and isinstance(got[0], EngineFatal) and said in got[0].message, got
    assert proc._proc is None  # the child is gone (the garbled one was killed)


def test_hostile_clients_each_get_their_4xx_from_the_real_server():
    from lab.server_load.hostile import run_hostile
    from app.server.runner import LocalServer

    srv = LocalServer(FakeGateway(), defaults=Defaults("off", sampling=GREEDY), port=0).start()
    try:
        stop = threading.Event()
        threading.Timer(0.1, stop.set).start()  # one round of every case (a round takes longer)
        s = run_hostile(srv.url, stop, timeout=20).summary()
        assert s["sent"] >= 10 and s["unexpected"] == {} and s["server_errors"] == 0, s
        assert s["by_class"] == {"2xx": 3, "4xx": s["sent"] - 3}, s  # the disconnect and both readers: 200
    finally:
        srv.stop()


def test_the_hostile_report_counts_each_status_class_and_a_5xx_as_a_server_error():
    from lab.server_load.hostile import HostileReport

    r = HostileReport()
    for got, want in (((400, ""), (400,)), ((429, "queue_full"), (400,)), ((503, "engine_loading"), (400,)),
                      ((None, "ConnectionResetError"), (200,))):
        r.count("case", got, want)
    s = r.summary()
    assert s["by_class"] == {"4xx": 2, "5xx": 1, "none": 1} and s["server_errors"] == 1, s
    assert (s["as_expected"], s["turned_away_queue_full"], len(s["unexpected"])) == (1, 1, 2), s


def test_a_slow_reader_and_one_that_stops_reading_do_not_hold_the_engine():
    from lab.server_load.hostile import slow_reader
    from app.server.runner import LocalServer

    gw = FakeGateway("long")
    srv = LocalServer(gw, defaults=Defaults("off", sampling=GREEDY), port=0, max_queue=1).start()
    try:
        box: dict = {}
        reader = threading.Thread(target=lambda: box.update(got=slow_reader(srv.url, byte_s=0.5, reads=4, hold_s=20)),
                                  daemon=True)
        reader.start()
        deadline = time.monotonic() + 10
        while gw.submitted == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        # the one queue slot: the slow reader's answer (3 MB, far past the socket's buffers) must not hold it
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            conn.request("POST", "/v1/chat/completions", body=json.dumps(CHAT),
                         headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            assert (r.status, json.loads(r.read())["usage"]["completion_tokens"]) == (200, 20_000)
            conn.close()
            assert reader.is_alive()  # still there, reading a byte at a time or not at all
            time.sleep(2.5)  # the second one while the reader has stopped reading
        reader.join(40)
        assert box["got"] == (200, "")
    finally:
        srv.stop()
