"""Real servers on loopback for the remote-engine tests: this app's `serve` and llama.cpp's own server
(llama-cpp-python's `llama_cpp.server`), each in its own process, and a small fault server for what a real
server will not do on demand (429, a stream that drops, a stream that stalls)."""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEY = "remote-test-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Process:
    """A server process this test started, its output in a file; `stop()` ends it (it alone)."""

    def __init__(self, argv: list[str], home: Path, name: str):
        self.log = home / f"{name}.log"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RIDGEFILL_HOME": str(home / "home")}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.url = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"{what} exited ({self.proc.returncode}):\n{self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not ready after {timeout:.0f} s:\n{self.output()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_ours(home: Path, *, ctx: int = 4096, api_key: str | None = KEY) -> Process:
    """`python -m app serve` on a free port (it prints the address it listens on)."""
    argv = [sys.executable, "-m", "app", "--ctx", str(ctx), "--threads", "1", "serve", "--port", "0"]
    p = Process(argv + (["--api-key", api_key] if api_key else []), home, "ridgefill-serve")

    def ready() -> bool:
        m = re.search(r"at (http://127\.0\.0\.1:\d+)/v1", p.output())
        p.url = m.group(1) if m else ""
        return bool(m)

    p.wait_for(ready, 240, "app serve")
    return p


def start_llama(home: Path, model_path: str, *, ctx: int = 4096) -> Process:
    """llama.cpp's own OpenAI-compatible server, as llama-cpp-python[server] runs it."""
    port = free_port()
    p = Process([sys.executable, "-m", "llama_cpp.server", "--model", model_path, "--host", "127.0.0.1",
                 "--port", str(port), "--n_ctx", str(ctx), "--n_threads", "1"], home, "llama-server")
    p.url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(p.url + "/v1/models", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    p.wait_for(ready, 240, "llama_cpp.server")
    return p


MODELS = {"object": "list", "data": [{"id": "fault-model", "object": "model", "owned_by": "someone"}]}


class FaultServer:
    """An OpenAI-looking server that lists one model and answers every chat request with `fault`:
    "429", "drop" (a stream cut in the middle: its length promised more), "stall" (a stream that goes
    silent), "unfinished" (a stream that ends cleanly without a finish_reason)."""

    def __init__(self, fault: str):
        self.fault = fault
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def _json(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                             **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._json(200, MODELS)

            def do_POST(self):
                outer.requests.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                if outer.fault == "429":
                    return self._json(429, {"error": {"message": "Rate limit reached", "type": "rate_limit"}},
                                      {"Retry-After": "7"})
                piece = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "fault-model",
                         "choices": [{"index": 0, "delta": {"content": "The cat is"}, "finish_reason": None}]}
                first = f"data: {json.dumps(piece)}\n\n".encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Content-Length", str(len(first) if outer.fault == "unfinished" else 100_000))
                self.end_headers()
                self.wfile.write(first)
                self.wfile.flush()
                if outer.fault == "stall":
                    time.sleep(3)
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
