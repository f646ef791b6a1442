"""A bounded load test against a running server, and what the server adds to a direct engine call.

`run_load`: C client threads each send R short chat requests about one short document, one after the
other (every other one streamed), with the standard library's HTTP client. A 429 (the queue is full)
is retried after its Retry-After, as the openai client does (at most `retries` times, counted). Every
request ends as answered (200 with an answer), rejected (an HTTP error with an OpenAI-style reason) or
lost (no HTTP answer at all: a reset, a timeout, a broken stream). Afterwards /health must say ok with
nothing in flight.

`added_latency`: the same short request, alternately through HTTP and straight to the gateway
(EngineProcess, no HTTP), so the difference is what the HTTP server adds; the engine's own time
(its timings) shows what the process hop adds.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field

from app.engine_protocol import TaskCancelled, TaskDone, TaskFailed, TaskKind
from backend.protocol import ChatMessage, CompletionRequest

DOCUMENT = (
    "Harbour log, week 14. The ferry Marisol left Pier 3 at 06:40 with 212 passengers. The cargo ship "
    "Northern Lark unloaded 48 containers of copper wire. The harbour master, Ines Duarte, closed Pier 5 "
    "for repairs until Friday. The lighthouse keeper reported fog on Tuesday and Wednesday."
)
QUESTIONS = ["How many passengers did the Marisol carry?", "Who is the harbour master?",
             "Which pier is closed?", "What did the Northern Lark unload?", "When was there fog?"]


@dataclass
class Outcome:
    client: int
    n: int
    stream: bool
    status: int | None  # None: no HTTP answer (lost)
    kind: str  # answered | rejected | lost
    seconds: float
    reason: str = ""
    retried: int = 0  # 429s retried after their Retry-After


@dataclass
class LoadReport:
    clients: int
    requests_per_client: int
    seconds: float
    outcomes: list[Outcome] = field(default_factory=list)
    health_after: dict = field(default_factory=dict)

    def count(self, kind: str) -> int:
        return sum(o.kind == kind for o in self.outcomes)

    @property
    def healthy_after(self) -> bool:
        return self.health_after.get("status") == "ok" and self.health_after.get("in_flight") == 0

    def summary(self) -> dict:
        ok = sorted(o.seconds for o in self.outcomes if o.kind == "answered")
        reasons = Counter(f"{o.status} {o.reason}" for o in self.outcomes if o.kind != "answered")
        pct = (lambda q: round(ok[min(len(ok) - 1, int(q * len(ok)))] * 1000)) if ok else (lambda q: None)
        return {"clients": self.clients, "requests_per_client": self.requests_per_client,
                "sent": len(self.outcomes), "answered": self.count("answered"), "rejected": self.count("rejected"),
                "lost": self.count("lost"), "retried_429": sum(o.retried for o in self.outcomes),
                "reasons": dict(reasons), "wall_s": round(self.seconds, 2),
                "answered_per_s": round(len(ok) / self.seconds, 2) if self.seconds else 0.0,
                "latency_ms": {"p50": pct(0.5), "p95": pct(0.95), "max": round(ok[-1] * 1000) if ok else None},
                "healthy_after": self.healthy_after, "health_after": self.health_after}


def _headers(api_key: str | None) -> dict:
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def get_json(url: str, api_key: str | None = None, timeout: float = 30.0) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers=_headers(api_key))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def chat_body(question: str, max_tokens: int, stream: bool) -> dict:
    content = f"Read this document.\n\n{DOCUMENT}\n\nQuestion: {question}"
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "stream": stream}


def one_request(base_url: str, body: dict, api_key: str | None, timeout: float) -> tuple[int | None, str, str]:
    """(status, kind, reason) of one POST /v1/chat/completions; a stream must end with [DONE]."""
    req = urllib.request.Request(base_url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers=_headers(api_key), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode("utf-8")
            if body.get("stream"):
                events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
                if not events or events[-1] != "[DONE]":
                    return r.status, "lost", "the stream ended without [DONE]"
                for e in events[:-1]:
                    if "error" in json.loads(e):
                        return r.status, "rejected", json.loads(e)["error"].get("message", "")
                return r.status, "answered", ""
            answer = json.loads(raw)
            if not answer.get("choices") or "timings" not in answer:
                return r.status, "lost", "an answer without choices or timings"
            return r.status, "answered", ""
    except urllib.error.HTTPError as exc:
        if exc.code == 429:
            return 429, "busy", exc.headers.get("Retry-After", "1")
        try:
            err = json.loads(exc.read()).get("error", {})
            return exc.code, "rejected", f"{err.get('code')}: {err.get('message', '')[:80]}"
        except ValueError:
            return exc.code, "lost", "an error without an OpenAI-style JSON body"
    except (OSError, ValueError) as exc:  # reset, refused, timed out, malformed
        return None, "lost", f"{type(exc).__name__}: {exc}"


def retrying(base_url: str, body: dict, api_key: str | None, timeout: float, retries: int) -> tuple:
    """one_request, a 429 retried as the openai client does: after its Retry-After or an exponential backoff
    (0.5 s doubling, at most 8 s), whichever is longer. (status, kind, reason, times retried)."""
    for retried in range(retries + 1):
        status, kind, reason = one_request(base_url, body, api_key, timeout)
        if kind != "busy":
            return status, kind, reason, retried
        try:
            after = float(reason)
        except ValueError:
            after = 1.0
        time.sleep(min(60.0, max(after, min(8.0, 0.5 * 2**retried))))
    return status, "rejected", f"queue_full: still busy after {retries} retries", retries


def run_load(base_url: str, *, clients: int = 8, requests: int = 5, max_tokens: int = 8,
             api_key: str | None = None, timeout: float = 600.0, retries: int = 75) -> LoadReport:
    """C clients x R requests, all at once; returns every outcome and /health afterwards."""
    outcomes: list[Outcome] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(c: int) -> None:
        start.wait()
        for n in range(requests):
            stream = (c + n) % 2 == 1
            body = chat_body(QUESTIONS[(c + n) % len(QUESTIONS)], max_tokens, stream)
            t0 = time.perf_counter()
            status, kind, reason, retried = retrying(base_url, body, api_key, timeout, retries)
            with lock:
                outcomes.append(Outcome(c, n, stream, status, kind, time.perf_counter() - t0, reason, retried))

    threads = [threading.Thread(target=client, args=(c,), name=f"load-client-{c}") for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = LoadReport(clients, requests, time.perf_counter() - t0, outcomes)
    report.health_after = health_when_idle(base_url)
    return report


def health_when_idle(base_url: str, timeout: float = 30.0) -> dict:
    """/health once nothing is in flight (a cancelled or last task may still be ending), or at `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        _, health = get_json(base_url + "/health")
        if health.get("in_flight") == 0 or time.monotonic() > deadline:
            return health
        time.sleep(0.1)


def added_latency(base_url: str, gateway, *, repeats: int = 5, max_tokens: int = 8,
                  api_key: str | None = None) -> dict:
    """Median wall time of one short chat request through HTTP and straight to the gateway (alternating,
    after one unmeasured request of each), and the engine's own time for it."""
    from app.server.api import model_id

    content = f"Read this document.\n\n{DOCUMENT}\n\nQuestion: {QUESTIONS[0]}"
    http_s, direct_s, engine_ms = [], [], []

    def direct() -> float:
        done = threading.Event()
        box = {}

        def deliver(msg) -> None:
            if isinstance(msg, (TaskDone, TaskFailed, TaskCancelled)):
                box["end"] = msg
                done.set()

        req = CompletionRequest(messages=[ChatMessage("user", content)], max_tokens=max_tokens, mode="off")
        t0 = time.perf_counter()
        gateway.submit(TaskKind.COMPLETE, req, deliver)
        done.wait(300)
        took = time.perf_counter() - t0
        end = box.get("end")
        if isinstance(end, TaskDone):
            t = end.result.timings
            engine_ms.append(t.ttft_ms + t.predicted_ms)
        return took

    body = {"model": model_id(gateway.info), "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "ridgefill": {"mode": "off"}}
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        status, kind, reason = one_request(base_url, body, api_key, 300)
        h = time.perf_counter() - t0
        d = direct()
        if kind != "answered":
            raise RuntimeError(f"the latency request was not answered: {status} {reason}")
        if i:  # the first pair warms both paths up
            http_s.append(h)
            direct_s.append(d)
    http_ms, direct_ms = statistics.median(http_s) * 1000, statistics.median(direct_s) * 1000
    return {"repeats": repeats, "max_tokens": max_tokens, "http_ms": round(http_ms, 1),
            "direct_ms": round(direct_ms, 1), "engine_ms": round(statistics.median(engine_ms[1:]), 1),
            "added_by_http_ms": round(http_ms - direct_ms, 1),
            "added_by_process_hop_ms": round(direct_ms - statistics.median(engine_ms[1:]), 1)}


def report_lines(summary: dict, latency: dict | None = None) -> list[str]:
    s = summary
    lines = [f"{s['clients']} clients x {s['requests_per_client']} requests: {s['sent']} sent, {s['answered']} answered, "
             f"{s['rejected']} rejected, {s['lost']} lost, in {s['wall_s']} s ({s['answered_per_s']} answers/s); "
             f"{s['retried_429']} times 429 queue_full, retried after Retry-After",
             f"latency of answered requests: p50 {s['latency_ms']['p50']} ms, p95 {s['latency_ms']['p95']} ms, "
             f"max {s['latency_ms']['max']} ms"]
    lines += [f"  {n} x {reason}" for reason, n in s["reasons"].items()]
    h = s["health_after"]
    lines.append(f"health afterwards: {h.get('status')}, {h.get('in_flight')} in flight, counters {h.get('stats')}")
    if latency:
        lines.append(f"one short request ({latency['max_tokens']} tokens, median of {latency['repeats']}): HTTP "
                     f"{latency['http_ms']} ms, direct to the engine process {latency['direct_ms']} ms, inside the "
                     f"engine {latency['engine_ms']} ms: the server adds {latency['added_by_http_ms']} ms, the "
                     f"process hop {latency['added_by_process_hop_ms']} ms")
    return lines


def as_dict(report: LoadReport) -> dict:
    return {**report.summary(), "outcomes": [asdict(o) for o in report.outcomes]}
