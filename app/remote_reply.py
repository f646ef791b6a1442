"""What a server's JSON says, read with its types checked and within limits (app/remote_wire.py's): the model
list, each chunk of a streamed answer, the server's timings and our server's sources. Anything of the wrong
shape is a BadReply quoting it, which app/remote_engine.explain turns into a RemoteError naming the server."""
from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from app.remote_wire import (
    MAX_ANSWER_CHARS,
    MAX_EVENTS,
    MAX_MODEL_ID_CHARS,
    MAX_MODELS,
    MAX_SOURCE_CHARS,
    MAX_SOURCES,
    BadReply,
    excerpt,
)
from backend.protocol import CompletionRequest
from backend.sources import Source

OURS = "ridgefill-desktop"  # the owned_by of this app's /v1/models entries (app/server/schema.py model_card)
# The timings fields the app reads as numbers (llama.cpp's names, and ours); a value of another type is dropped
TIMING_NUMBERS = {"prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                  "predicted_per_second", "cache_n", "ttft_ms", "bulk_n", "exact_n", "split", "tail", "sources_ms"}
MAX_TIMING_KEYS = 64  # llama.cpp sends about ten, ours about twenty
MESSAGE_NAME = re.compile(r"messages\[(\d{1,6})\]")


def field_of(obj: dict, key: str, kind: type, where: str, whole: Any) -> Any:
    """obj[key] if it is of `kind` (or missing / null: None); else a BadReply quoting `whole`."""
    value = obj.get(key)
    if value is None or (isinstance(value, kind) and not (kind is int and isinstance(value, bool))):
        return value
    raise BadReply(f"{where} whose \"{key}\" is {type(value).__name__}, not {kind.__name__}: {excerpt(whole)}")


def read_models(data: Any) -> tuple[list[str], bool, dict]:
    """GET /v1/models' body: (the model ids, whether the server is this app's, our server's model meta)."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise BadReply(f"a model list with no \"data\" list: {excerpt(data)}")
    if len(entries) > MAX_MODELS:
        raise BadReply(f"a list of {len(entries):,} models (this app reads at most {MAX_MODELS:,})")
    ids = []
    for entry in entries:
        model_id = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(model_id, str) or not model_id.strip():
            raise BadReply(f"a model entry with no id: {excerpt(entry)}")
        if len(model_id) > MAX_MODEL_ID_CHARS:
            raise BadReply(f"a model id of {len(model_id):,} characters (this app takes at most "
                           f"{MAX_MODEL_ID_CHARS:,}): {excerpt(model_id)}")
        ids.append(model_id)
    ours = any(entry.get("owned_by") == OURS for entry in entries)
    meta = entries[0].get("meta") if ours else None
    return ids, ours, meta if isinstance(meta, dict) else {}


def server_timings(raw: dict | None) -> dict | None:
    """The server's timings as sent, less what the app could not show: numbers that are not finite numbers,
    values that are not scalars, and keys past MAX_TIMING_KEYS."""
    if raw is None:
        return None
    out = {}
    for key, value in list(raw.items())[:MAX_TIMING_KEYS]:
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if number or (key not in TIMING_NUMBERS and (value is None or isinstance(value, bool)
                                                      or isinstance(value, str) and len(value) <= 500)):
            out[key] = value
    return out


@dataclass
class Reply:
    """What a stream brought so far, and when (perf_counter seconds)."""
    t0: float
    parts: list = field(default_factory=list)
    length: int = 0  # characters in parts
    first: float | None = None
    last: float = 0.0
    pieces: int = 0
    events: int = 0
    finish: str | None = None
    timings: dict | None = None
    sources: list | None = None
    usage: dict | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def take(self, chunk: Any) -> str:
        """One chunk's JSON: its text (the deltas' content), keeping its timings, sources, usage and finish."""
        self.events += 1
        if self.events > MAX_EVENTS:
            raise BadReply(f"over {MAX_EVENTS:,} chunks for one answer (this app reads at most that)")
        if not isinstance(chunk, dict):
            raise BadReply(f"a chunk that is not a JSON object: {excerpt(chunk)}")
        if chunk.get("error") is not None:
            raise BadReply(f"an error in its stream: {excerpt(chunk['error'])}")
        self.timings = field_of(chunk, "timings", dict, "a chunk", chunk) or self.timings
        self.sources = field_of(chunk, "sources", list, "a chunk", chunk) or self.sources
        self.usage = field_of(chunk, "usage", dict, "a chunk", chunk) or self.usage
        piece = ""
        for choice in field_of(chunk, "choices", list, "a chunk", chunk) or []:
            if not isinstance(choice, dict):
                raise BadReply(f"a choice that is not an object: {excerpt(chunk)}")
            delta = field_of(choice, "delta", dict, "a choice", chunk) or {}
            piece += field_of(delta, "content", str, "a delta", chunk) or ""
            if field_of(choice, "finish_reason", str, "a choice", chunk):
                self.finish = "length" if choice["finish_reason"] == "length" else "stop"
        if piece:
            self.add(piece)
        return piece

    def add(self, piece: str) -> None:
        if self.length + len(piece) > MAX_ANSWER_CHARS:
            raise BadReply(f"an answer over {MAX_ANSWER_CHARS:,} characters (this app keeps at most that), "
                           f"ending {excerpt(piece[-80:])}")
        now = time.perf_counter()
        self.first = now if self.first is None else self.first
        self.last = now
        self.pieces += 1
        self.length += len(piece)
        self.parts.append(piece)


def count_in(obj: dict | None, key: str) -> int:
    """A count from the server's JSON: a finite number from 0 to 10^12, else 0 (not known)."""
    value = (obj or {}).get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return int(value) if ok and 0 <= value < 1e12 else 0


def read_source(raw: Any) -> tuple[str, int | None, int, int, str, float]:
    """One of our server's sources: (document, page, start, end, text, score), each of its type."""
    if not isinstance(raw, dict):
        raise BadReply(f"a source that is not an object: {excerpt(raw)}")
    name = field_of(raw, "document", str, "a source", raw) or ""
    page = field_of(raw, "page", int, "a source", raw)
    start = field_of(raw, "start", int, "a source", raw) or 0
    end = field_of(raw, "end", int, "a source", raw) or 0
    text = field_of(raw, "text", str, "a source", raw) or ""
    score = raw.get("score") if isinstance(raw.get("score"), (int, float)) else 0.0
    if len(text) > MAX_SOURCE_CHARS:
        raise BadReply(f"a source of {len(text):,} characters (this app takes at most {MAX_SOURCE_CHARS:,}): "
                       f"{excerpt(text)}")
    return name, page, start, end, text, float(score)


def place_sources(raw: list, request: CompletionRequest) -> list[Source]:
    """Our server's sources point into the request's messages ("messages[i]", offsets into its content): put
    them back into the documents they fall in, with their pages. One outside every document keeps its place."""
    if len(raw) > MAX_SOURCES:
        raise BadReply(f"{len(raw):,} sources (this app takes at most {MAX_SOURCES})")
    msgs = request.messages or []
    out = []
    for entry in raw:
        name, page, start, end, text, score = read_source(entry)
        match = MESSAGE_NAME.fullmatch(name)
        i = int(match.group(1)) if match else -1
        for d in request.documents or []:
            body = d.text.strip()
            at = msgs[i].content.find(body) if 0 <= i < len(msgs) and body else -1
            if at >= 0 and at <= start < at + len(body):
                lead = len(d.text) - len(d.text.lstrip())  # the message holds the stripped text
                name, start, end = d.name, start - at + lead, end - at + lead
                page = d.page_at(start)
                break
        out.append(Source(name, page, start, end, text, score))
    return out
