"""The engine killed under the real server (issue 39): the embedded model in an engine process behind the
real server on a loopback port; its child is killed (SIGKILL) while one client streams and two wait in the
queue. Every client gets an answer or a clear error in time (none hangs), the engine comes back, and the
next request is answered."""
from __future__ import annotations

import http.client
import json
import os
import signal
import threading
import time

import pytest

from app.server.schema import Defaults
from backend.sampling import GREEDY

STORY = {"messages": [{"role": "user", "content": "Tell a long story about a lighthouse."}], "max_tokens": 400,
         "stream": True, "ridgefill": {"mode": "off"}}
SHORT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "ridgefill": {"mode": "off"}}
JSON = {"Content-Type": "application/json"}
WAIT_S = 60  # no client may wait longer than this for its answer or its error


@pytest.fixture
def served(model_path):
    from app.engine_protocol import EngineSettings
    from app.server.gateway import ProcessGateway
    from app.server.runner import LocalServer

    gw = ProcessGateway(EngineSettings(model_path, n_ctx=1024, n_batch=256, warm_up=False)).start()
    gw.wait_ready()
    srv = LocalServer(gw, defaults=Defaults("off", sampling=GREEDY), port=0, max_queue=4).start()
    yield gw, srv
    srv.stop()
    gw.close()


def post(port: int, body: dict) -> tuple[int, dict, dict]:
    """(status, the JSON answer, headers) of one request that is not streamed."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers=JSON)
        r = conn.getresponse()
        return r.status, json.loads(r.read()), {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()


def stream(port: int, started: threading.Event, box: dict) -> None:
    """A streamed request: its status and every event, `started` set at the first piece of text."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps(STORY), headers=JSON)
        r = conn.getresponse()
        box["status"], box["events"] = r.status, []
        while line := r.readline():
            if line.startswith(b"data: "):
                box["events"].append(line[6:].strip().decode())
                started.set()
    finally:
        started.set()
        conn.close()


def in_flight(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())["in_flight"]
    finally:
        conn.close()


def test_the_engine_killed_mid_stream_and_mid_queue_answers_everyone_and_comes_back(served):
    gw, srv = served
    pid = gw.info.pid
    streamed, started = {}, threading.Event()
    queued: list = [{}, {}]
    threads = [threading.Thread(target=stream, args=(srv.port, started, streamed), daemon=True)]
    threads[0].start()
    assert started.wait(WAIT_S) and streamed.get("status") == 200, streamed
    for box in queued:  # two more wait in the queue behind the story
        threads.append(threading.Thread(target=lambda b=box: b.update(got=post(srv.port, SHORT)), daemon=True))
        threads[-1].start()
    deadline = time.monotonic() + 20
    while in_flight(srv.port) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert in_flight(srv.port) == 3
    os.kill(pid, signal.SIGKILL)
    for t in threads:
        t.join(WAIT_S)
    assert not any(t.is_alive() for t in threads), "a client still waits after the engine was killed"
    # the stream: its text so far, then an error event saying what happened (its status line had gone)
    last = json.loads(streamed["events"][-1])
    assert last["error"]["code"] == "engine_crashed" and "stopped unexpectedly" in last["error"]["message"], last
    for box in queued:  # the waiting ones: 503, the engine's fault, with Retry-After (the openai client retries)
        status, body, headers = box["got"]
        assert (status, body["error"]["code"], headers.get("retry-after")) == (503, "engine_crashed", "1"), box
    deadline = time.monotonic() + 120  # the crash clears the old engine's info just after the failures go out
    while (gw.wait_ready(120).pid == pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gw.wait_ready(120).pid != pid  # a fresh engine
    status, body, _ = post(srv.port, SHORT)
    assert status == 200 and body["choices"][0]["message"]["content"], body
    assert in_flight(srv.port) == 0
