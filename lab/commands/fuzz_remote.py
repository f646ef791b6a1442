"""`python -m lab.commands.fuzz_remote --examples N --seed S`: the remote client (app/remote_engine.py) against
a loopback server that answers at random.

Each input is a script for one question: the model list's reply and the answer's, each a status code, headers
(the content type, a Content-Length that may lie), a body (a stream of good chunks, chunks with one value of
the wrong type, JSON cut short, HTML, random bytes) written in pieces cut at random points, and whether the
connection closes early. The client must return an answer or raise RemoteError, never anything else, and
never hang (past HANG_S of wall time). The suite runs the same property briefly (tests/test_remote_fuzz.py).
Hypothesis is a test extra: it is imported only when the command runs. `register(sub)` adds it as
`python -m lab fuzz-remote` where lab/cli.py lists it.
"""
from __future__ import annotations

import argparse
import json
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

from lab.fuzz_report import add_options, count, finding, hypothesis_missing, new_stats, report

HANG_S = 20.0  # an input whose question has not ended by then is a hang (the client's read timeout is 1 s)
READ_TIMEOUT_S = 1.0
STATUSES = [200, 200, 200, 200, 201, 204, 301, 400, 401, 404, 429, 500, 502, 503]
TYPES = ["text/event-stream", "text/event-stream; charset=utf-8", "application/json", "text/html", "", "text/plain"]
EDGES = [None, True, 0, -1, 2**63, 1e308, float("nan"), "", "x" * 300, [], {}, [1, {"a": None}], "stop", "length"]
CHUNK_FIELDS = [("choices",), ("choices", 0), ("choices", 0, "delta"), ("choices", 0, "delta", "content"),
                ("choices", 0, "finish_reason"), ("usage",), ("usage", "completion_tokens"), ("timings",),
                ("timings", "prompt_ms"), ("timings", "mode"), ("sources",), ("sources", 0),
                ("sources", 0, "start"), ("sources", 0, "text"), ("error",), ()]


def chunk(text: str, finish: str | None = None) -> dict:
    return {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}


def put(node, path: tuple, value):
    """`node` with `value` at `path` where the path exists (the last key added to an object); () replaces it."""
    if not path:
        return value
    if isinstance(node, dict):
        copy = dict(node)
        copy[path[0]] = value if len(path) == 1 else put(node.get(path[0]), path[1:], value)
        return copy
    if isinstance(node, list) and isinstance(path[0], int) and path[0] < len(node):
        copy = list(node)
        copy[path[0]] = put(node[path[0]], path[1:], value)
        return copy
    return node


def strategies():
    """A strategy of scripts: {"models": reply, "chat": reply, "ours": bool}, a reply being (status, headers,
    pieces, close_early)."""
    from hypothesis import strategies as st

    scalar = st.one_of(st.sampled_from(EDGES), st.integers(), st.floats(), st.text(max_size=12))
    junk = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)
    timings = st.fixed_dictionaries({}, optional={"prompt_n": st.integers(0, 10**6), "prompt_ms": st.floats(0, 1e6),
                                                  "mode": st.sampled_from(["speed", "off"]), "split": st.integers(0, 30)})
    source = st.fixed_dictionaries({"document": st.sampled_from(["messages[0]", "messages[9]", "x"]),
                                    "start": st.integers(0, 500), "end": st.integers(0, 500),
                                    "text": st.text(max_size=20), "score": st.floats(0, 1)})
    good = st.builds(lambda text, finish, t, s: {**chunk(text, finish), "timings": t, "sources": s},
                     st.text(max_size=12), st.sampled_from([None, None, "stop", "length"]),
                     st.none() | timings, st.none() | st.lists(source, max_size=3))
    event = st.one_of(good, good, good, st.tuples(good, st.sampled_from(CHUNK_FIELDS), junk).map(
        lambda t: put(t[0], t[1], t[2])))
    done = chunk("", "stop")
    line = st.one_of(event.map(lambda e: b"data: " + json.dumps(e).encode() + b"\n\n"),
                     event.map(lambda e: b"data: " + json.dumps(e).encode() + b"\n\n"),
                     event.map(lambda e: b"data: " + json.dumps(e).encode() + b"\n\n"),
                     st.just(b"data: [DONE]\n\n"), st.just(b": keep-alive\n\n"),
                     st.binary(max_size=30), st.just(b"event: error\ndata: {\"message\": \"boom\"}\n\n"),
                     event.map(lambda e: b"data: " + json.dumps(e).encode()[:-3] + b"\n\n"))
    stream = st.tuples(st.lists(line, max_size=8), st.booleans()).map(  # half end with a finish, as servers do
        lambda t: b"".join(t[0]) + (b"data: " + json.dumps(done).encode() + b"\n\ndata: [DONE]\n\n" if t[1] else b""))
    clean = st.lists(good, max_size=6).map(lambda es: b"".join(
        b"data: " + json.dumps(e).encode() + b"\n\n" for e in es + [done]) + b"data: [DONE]\n\n")
    html = st.just(b"<html><body><h1>502 Bad Gateway</h1></body></html>")
    models_ok = st.builds(lambda ids, ours: json.dumps({"object": "list", "data": [
        {"id": i, "object": "model", "owned_by": "ridgefill-desktop" if ours else "x"} for i in ids]}).encode(),
        st.lists(st.text(min_size=1, max_size=10), min_size=1, max_size=3), st.booleans())
    models_bad = st.one_of(html, st.binary(max_size=40), junk.map(lambda j: json.dumps(j).encode()),
                           models_ok.map(lambda b: b[: len(b) // 2]))

    def reply(body, statuses, types):
        return st.tuples(statuses, types, body, st.one_of(st.none(), st.none(), st.none(), st.integers(0, 400)),
                         st.lists(st.integers(1, 64), max_size=6), st.booleans())

    models = st.one_of(reply(models_ok, st.just(200), st.just("application/json")),
                       reply(models_ok, st.just(200), st.just("application/json")),
                       reply(models_bad, st.sampled_from(STATUSES), st.sampled_from(TYPES)))
    chat = st.one_of(reply(clean, st.just(200), st.just("text/event-stream")),
                     reply(stream, st.just(200), st.just("text/event-stream")),
                     reply(stream | html | st.binary(max_size=60), st.sampled_from(STATUSES), st.sampled_from(TYPES)))
    return st.fixed_dictionaries({"models": models, "chat": chat})


class FuzzServer:
    """A loopback server answering GET /v1/models and POST /v1/chat/completions from `script`, its bytes
    written raw: the status line, the headers, the body in pieces cut where the script says."""

    def __init__(self):
        self.script: dict = {}
        self.engine = None  # the client asking it (check)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                self.answer(outer.script["models"])

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.answer(outer.script["chat"])

            def answer(self, reply) -> None:
                status, kind, body, length, cuts, close_early = reply
                head = [f"HTTP/1.1 {status} X", "Connection: close"] + ([f"Content-Type: {kind}"] if kind else [])
                head.append(f"Content-Length: {length if length is not None else len(body)}")
                if close_early:
                    body = body[: len(body) // 2]
                try:
                    self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode())
                    at = 0
                    for cut in cuts:  # pieces cut at these offsets, each flushed
                        self.wfile.write(body[at:at + cut])
                        self.wfile.flush()
                        at += cut
                    self.wfile.write(body[at:])
                    self.wfile.flush()
                except OSError:
                    pass
                self.close_connection = True

        class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def check(server: FuzzServer, script: dict) -> str:
    """One question against `script`: "answer" or "refused" (a RemoteError naming the server); anything else,
    or a question still running after HANG_S, raises."""
    from app.remote_engine import RemoteEngine, RemoteError, RemoteResult
    from backend.protocol import ChatMessage, CompletionRequest

    server.script = script
    outcome: list = []
    if server.engine is None:  # one client for the run (its SSL context takes milliseconds to build)
        server.engine = RemoteEngine(server.url, read_timeout_s=READ_TIMEOUT_S, connect_timeout_s=5)
    engine = server.engine
    engine.info, engine.model = None, ""

    def ask() -> None:
        try:
            outcome.append(engine.complete(CompletionRequest(messages=[ChatMessage("user", "q")], max_tokens=8)))
        except BaseException as exc:  # noqa: BLE001 - judged below, on the caller's thread
            outcome.append(exc)

    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(HANG_S)
    if not outcome:
        raise TimeoutError(f"a question still running after {HANG_S:.0f} s")
    got = outcome[0]
    if isinstance(got, RemoteError):
        assert server.url in str(got), f"an error that does not name the server: {got}"
        return "refused"
    if isinstance(got, BaseException):
        raise got
    assert isinstance(got, RemoteResult) and isinstance(got.text, str) and got.finish_reason in ("stop", "length")
    return "answer"


class TimeUp(Exception):
    """--minutes have passed."""


def register(sub) -> None:
    p = sub.add_parser("fuzz-remote", help="fuzz the remote client against a loopback server answering at random")
    add_options(p, 100_000)
    p.set_defaults(func=run)


def run(args) -> int:
    if hypothesis_missing("fuzz-remote"):
        return 2
    from hypothesis import HealthCheck, Phase, given, seed, settings

    stats = new_stats()
    server, t0 = FuzzServer(), time.perf_counter()
    deadline = t0 + args.minutes * 60 if args.minutes else float("inf")

    @seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategies())
    def one(script: dict) -> None:
        if time.perf_counter() > deadline:
            raise TimeUp  # ends Hypothesis' run (returning would still draw every remaining example)
        started = time.perf_counter()
        try:
            outcome = check(server, script)  # "answer", or "refused" with a RemoteError
        except Exception as exc:  # noqa: BLE001 - counted and shown once per kind, the run goes on
            outcome = finding(stats, exc, script)
        count(stats, outcome, started)

    try:
        one()
    except TimeUp:
        stats["out_of_time"] = True
    finally:
        server.stop()
    return 1 if report("fuzz-remote", stats, time.perf_counter() - t0, args.seed) else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m lab.commands.fuzz_remote", description=__doc__.split("\n")[0])
    add_options(parser, 100_000)
    sys.exit(run(parser.parse_args()))
