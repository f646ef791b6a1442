"""The OpenAI wire format: request bodies in, CompletionRequests out; results and chunks back.

Parsing is strict where a wrong value would silently change the answer (types, ranges, n > 1, an
unknown RidgeFill mode) and lenient about fields that do not apply here (user, logit_bias...: accepted
and ignored, as llama.cpp's server does). The sampling fields (OpenAI's temperature, top_p, seed,
presence and frequency penalties; llama.cpp's top_k, min_p, repeat_penalty, repeat_last_n and the DRY
fields dry_multiplier, dry_base, dry_allowed_length, dry_penalty_last_n, dry_sequence_breakers) reach the
sampler; what a request leaves out is the model's default (backend/sampling.py), as in the GUI.
Responses follow the OpenAI schema, plus
llama.cpp server's `timings` object (backend.protocol.Timings: prompt_n, prompt_ms, ..., cache_n,
ttft_ms, and RidgeFill's mode, split, tail, bulk_n and exact_n, the rows made exact), and beside it
`sources`: the answer's sources in the request's messages (message_documents).
"""
from __future__ import annotations

import json
import logging
import math
import re
import reprlib
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from app.model_tuning import untuned_note_of_file
from backend.documents import DocumentText
from backend.protocol import DEFAULT_MAX_TOKENS, MODEL_DEFAULT, MODES, ChatMessage, CompletionRequest, CompletionResult, Timings
from backend.ridgefill.defaults import DEFAULT_MODE
from backend.sampling import RANGES, SamplingParams, breakers_error, model_defaults, numeric_fields

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_MESSAGES = 2048  # OpenAI's limit on a request's messages; applied here to a message's content parts too
MAX_STOP_CHARS = 256  # each is matched against the answer's end at every token: a long one would stall the loop
# Size-like fields beyond any context the app runs (128K tokens) are mistakes or attacks, refused rather than sent on
MAX_TOKEN_COUNT = 1_048_576
MAX_LAYERS = 1_024  # split's bound when the model's layer count is not known
CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
UNSUPPORTED = ("logprobs", "echo", "tools", "functions")
_SHOWN = reprlib.Repr()  # a value in an error message: short, and safe on deeply nested lists
_SHOWN.maxstring = _SHOWN.maxother = 60
_SHOWN.maxlevel = 2
_LONE = re.compile("[\ud800-\udfff]")  # half a UTF-16 pair: UTF-8 has no bytes for it, so neither has the reply
log = logging.getLogger(__name__)


class ApiError(Exception):
    """An OpenAI-style error: {"error": {"message", "type", "param", "code", ...extra}} with a status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, **extra: Any):
        super().__init__(message)
        self.status = status
        self.body = sendable({"error": {"message": message, "type": type, "param": param, "code": code, **extra}})


@dataclass
class Defaults:
    """What a request gets for what it leaves out: the app's RidgeFill defaults unless `serve` says."""

    mode: str | None = None  # None: the served model's default (backend/ridgefill/defaults.default_mode)
    split: int | None = None  # None: the model's default (backend/ridgefill/defaults.py, in the engine)
    tail: int | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams | None = None  # None: the model's defaults (backend/sampling.py: model_defaults)


@dataclass
class Parsed:
    """A request body, checked: what the engine runs and how the answer goes back."""

    request: CompletionRequest
    chat: bool
    stream: bool = False
    include_usage: bool = False
    model: str | None = None


# ---- parsing ---------------------------------------------------------------------------------------
def shown(value: Any) -> str:
    return _SHOWN.repr(value)


def _no_constant(name: str):
    raise ApiError(400, f"The JSON body has {name}, which is not a number; send a finite number.",
                   code="invalid_json")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        _no_constant(text)
    return value


def decode_body(raw: bytes | bytearray) -> Any:
    """A request body -> its JSON value; ApiError(400) for anything that is not JSON with finite numbers."""
    try:
        return json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise ApiError(400, "The JSON body is nested too deeply to read; send a flatter object.",
                       code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"We could not parse the JSON body of your request ({shown(str(exc))}).",
                       code="invalid_json") from None


def _num(body: dict, name: str, kind: type, default, lo=None, hi=None):
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) if kind is float else isinstance(value, int)
    if isinstance(value, bool) or not ok:
        raise ApiError(400, f"'{name}' must be {'a number' if kind is float else 'an integer'}, not "
                       f"{shown(value)}.", param=name, code="invalid_type")
    if (lo is not None and not value >= lo) or (hi is not None and not value <= hi):  # `not`: NaN fails too
        rng = f"{lo} to {hi}" if hi is not None else f"at least {lo}"
        raise ApiError(400, f"'{name}' must be {rng}, not {shown(value)}.", param=name, code="invalid_value")
    return kind(value)


def _utf8(text: str, where: str) -> str:
    """`text` if it is text: a JSON string may escape half a surrogate pair, which the tokenizer cannot take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{where} has half a surrogate pair ({text[exc.start]!a}) at character {exc.start:,}; "
                       "send valid Unicode text.", param=where, code="invalid_value") from None
    return text


def _text(content: Any, where: str) -> str:
    """A message's content: a string, or a list of text parts (images and audio are not supported)."""
    if isinstance(content, str):
        return _utf8(content, where)
    if isinstance(content, list):
        if len(content) > MAX_MESSAGES:
            raise ApiError(400, f"{where}.content has {len(content):,} parts; at most {MAX_MESSAGES:,} are accepted: "
                           "join their text.", param=f"{where}.content", code="array_too_long")
        parts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ApiError(400, f"{where}: only text content parts are supported, not {shown(kind)}.",
                               param=where, code="invalid_value")
            parts.append(part["text"])
        return _utf8("".join(parts), where)
    raise ApiError(400, f"{where}.content must be a string or a list of text parts.", param=where, code="invalid_type")


def _messages(body: dict) -> list[ChatMessage]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError(400, "'messages' is required: a non-empty list of {role, content} objects.",
                       param="messages", code="missing_required_parameter" if msgs is None else "invalid_value")
    if len(msgs) > MAX_MESSAGES:
        raise ApiError(400, f"'messages' has {len(msgs):,} messages; at most {MAX_MESSAGES:,} are accepted in one "
                       "request: join some of them, or send the document as one message.", param="messages",
                       code="array_too_long")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ApiError(400, f"{where} must be an object with 'role' and 'content'.", param=where, code="invalid_type")
        given = m.get("role")
        role = CHAT_ROLES.get(given) if isinstance(given, str) else None
        if role is None:
            raise ApiError(400, f"{where}.role {shown(given)} is not supported; use one of "
                           f"{', '.join(CHAT_ROLES)}.", param=f"{where}.role", code="invalid_value")
        out.append(ChatMessage(role, _text(m.get("content"), where)))
    return out


def message_documents(messages: list[ChatMessage]) -> list[DocumentText]:
    """Documents come in the messages: each user or system message is one, named "messages[i]" (its index in
    the request), so a source's start and end index that message's content."""
    return [DocumentText(f"messages[{i}]", m.content) for i, m in enumerate(messages)
            if m.role in ("user", "system") and m.content.strip()]


def _prompt(body: dict) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(400, "'prompt' is required: a string (a list of token ids or of several prompts is not "
                       "supported).", param="prompt",
                       code="missing_required_parameter" if prompt is None else "invalid_value")
    if not prompt:
        raise ApiError(400, "'prompt' is empty.", param="prompt", code="invalid_value")
    return _utf8(prompt, "prompt")


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (not isinstance(stops, list) or len(stops) > MAX_STOP
            or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)):
        raise ApiError(400, f"'stop' must be a non-empty string of up to {MAX_STOP_CHARS} characters or a list of "
                       f"up to {MAX_STOP} of them.",
                       param="stop", code="invalid_value")
    return [_utf8(s, "stop") for s in stops]


def _ridgefill(body: dict, defaults: Defaults, n_layer: int | None, model_mode: str) -> dict:
    """The extra body field {"ridgefill": {"mode", "split", "tail", "quality_share", "reuse_prefix", "check"}};
    `model_mode`: the served model's default mode, where neither the body nor `defaults` names one."""
    opts = body.get("ridgefill") or {}
    if not isinstance(opts, dict):
        raise ApiError(400, "'ridgefill' must be an object, e.g. {\"mode\": \"speed\", \"split\": 18}.",
                       param="ridgefill", code="invalid_type")
    unknown = set(opts) - {"mode", "split", "tail", "quality_share", "reuse_prefix", "check"}
    if unknown:
        raise ApiError(400, f"unknown 'ridgefill' option(s): {', '.join(sorted(unknown))}; known: mode, split, "
                       "tail, quality_share, reuse_prefix, check.", param="ridgefill", code="invalid_value")
    mode = opts.get("mode", defaults.mode or model_mode)
    if not isinstance(mode, str) or mode not in (*MODES, MODEL_DEFAULT):
        raise ApiError(400, f"ridgefill.mode {shown(mode)} is not one of {', '.join((*MODES, MODEL_DEFAULT))}.",
                       param="ridgefill.mode",
                       code="invalid_value")
    hi = n_layer - 1 if n_layer else MAX_LAYERS
    split = _num(opts, "split", int, defaults.split, 1, hi)
    tail = _num(opts, "tail", int, defaults.tail, 0, MAX_TOKEN_COUNT)
    share = _num(opts, "quality_share", float, None, 0.0, 1.0)
    flags = {name: opts.get(name, default) for name, default in (("reuse_prefix", True), ("check", False))}
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ApiError(400, f"ridgefill.{name} must be true or false.", param=f"ridgefill.{name}",
                           code="invalid_type")
    return {"mode": mode, "split": split, "tail": tail, "quality_share": share, "reuse_prefix": flags["reuse_prefix"],
            "wait_check": flags["check"]}


def _sampling(body: dict, base: SamplingParams) -> SamplingParams:
    """Each sampling field the body gives (its name is SamplingParams'), checked against its range, over `base`."""
    given = {}
    for f in numeric_fields():
        kind = int if isinstance(getattr(base, f.name), int) else float
        value = _num(body, f.name, kind, None, *RANGES[f.name])
        if value is not None:
            given[f.name] = value
    breakers = body.get("dry_sequence_breakers")
    if breakers is not None:
        problem = breakers_error(breakers)
        if problem:
            raise ApiError(400, f"'dry_sequence_breakers' must be {problem}.", param="dry_sequence_breakers",
                           code="invalid_type" if not isinstance(breakers, list) else "invalid_value")
        given["dry_sequence_breakers"] = tuple(breakers)
    return replace(base, **given)


def parse_request(body: Any, *, chat: bool, defaults: Defaults, n_layer: int | None = None,
                  recommended: tuple = (), model_mode: str = MODEL_DEFAULT) -> Parsed:
    """A /v1/chat/completions (chat=True) or /v1/completions body -> what to run; ApiError(400) if wrong.
    `recommended`: the model file's recommended sampling (EngineReady.sampling), under what it leaves out;
    `model_mode`: the mode where neither the body nor `defaults.mode` names one ("default": the model's own,
    resolved by the engine's planner)."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object.", code="invalid_json")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, "'model' must be a string.", param="model", code="invalid_type")
    n = _num(body, "n", int, 1, 1)
    if n != 1:
        raise ApiError(400, "'n' must be 1: one engine answers one choice per request.", param="n",
                       code="invalid_value")
    # logprobs may be false or 0; echo, tools and functions anything empty (what clients send for "none")
    bad = next((k for k in UNSUPPORTED if (body.get(k) not in (None, False, 0) if k == "logprobs" else body.get(k))),
               None)
    if bad is not None:
        raise ApiError(400, f"'{bad}' is not supported by this server.", param=bad, code="unsupported_parameter")
    max_tokens = _num(body, "max_completion_tokens", int, None, 1, MAX_TOKEN_COUNT)
    if max_tokens is None:
        max_tokens = _num(body, "max_tokens", int, defaults.max_tokens, 1, MAX_TOKEN_COUNT)
    sampling = _sampling(body, defaults.sampling or model_defaults(dict(recommended))[0])
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", param="stream", code="invalid_type")
    so = body.get("stream_options") or {}
    if not isinstance(so, dict):
        raise ApiError(400, "'stream_options' must be an object.", param="stream_options", code="invalid_type")
    rf = _ridgefill(body, defaults, n_layer, model_mode)
    stop = _stop(body)
    if chat:
        messages = _messages(body)
        request = CompletionRequest(messages=messages, max_tokens=max_tokens, sampling=sampling, stop=stop,
                                    documents=message_documents(messages), **rf)
    else:
        request = CompletionRequest(prompt=_prompt(body), max_tokens=max_tokens, sampling=sampling, stop=stop, **rf)
    return Parsed(request, chat, stream, bool(so.get("include_usage")), model)


# ---- responses -------------------------------------------------------------------------------------
def sendable(reply: Any) -> Any:
    """`reply` as JSON in UTF-8 can carry it: a lone surrogate (a document's or a model file's odd text) becomes
    U+FFFD, a NaN or infinity null, each said in the log; else json.dumps(ensure_ascii=False) and the encoding of
    the body or event raise, and the client gets a 500 or a stream cut off."""
    changed = [0]

    def clean(value):
        if isinstance(value, str):
            if not value.isascii() and _LONE.search(value):
                changed[0] += 1
                return _LONE.sub("\ufffd", value)
            return value
        if isinstance(value, float) and not math.isfinite(value):
            changed[0] += 1
            return None
        if isinstance(value, dict):
            return {clean(k): clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value

    out = clean(reply)
    if changed[0]:
        log.warning("a reply held %d values JSON in UTF-8 cannot carry (half a surrogate pair, NaN): sent as "
                    "U+FFFD or null", changed[0])
    return out


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def finish_reason(result: CompletionResult) -> str:
    """OpenAI's reasons: "stop" (end of answer or a stop sequence) or "length" (max_tokens)."""
    return "stop" if result.finish_reason == "stop" else "length"


def usage(result: CompletionResult) -> dict:
    n = result.timings.predicted_n
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": n, "total_tokens": result.prompt_tokens + n,
            "prompt_tokens_details": {"cached_tokens": result.timings.cache_n}}


def timings(t: Timings) -> dict:
    return t.as_dict()


def sources(result: CompletionResult) -> list[dict]:
    """Where the answer looked (backend/sources.py), best first: document ("messages[i]"), page, start, end,
    text, score."""
    return [s.as_dict() for s in result.sources]


def response(p: Parsed, rid: str, model: str, created: int, result: CompletionResult) -> dict:
    """The whole (non-streamed) answer (cut at a stop sequence by the engine: backend/stopping.py)."""
    text, reason = result.text, finish_reason(result)
    if p.chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                  "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
    return sendable({"id": rid, "object": "chat.completion" if p.chat else "text_completion", "created": created,
                     "model": model, "choices": [choice], "usage": usage(result), "timings": timings(result.timings),
                     "sources": sources(result), **({"check": result.check} if result.check is not None else {})})


def chunk(p: Parsed, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          reason: str | None = None, result: CompletionResult | None = None) -> dict:
    """One streamed chunk: the role first (chat), then text pieces, then the finish reason with timings."""
    if p.chat:
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
            delta["content"] = ""
        if text is not None:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
    out = {"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion", "created": created,
           "model": model, "choices": [choice]}
    if result is not None:
        out["timings"] = timings(result.timings)
        out["sources"] = sources(result)
        if result.check is not None:  # asked for with ridgefill.check: RidgeFill's answer against exact's
            out["check"] = result.check
    if p.include_usage:
        out["usage"] = None  # OpenAI: null on every chunk but the last, usage-only one
    return sendable(out)


def usage_chunk(p: Parsed, rid: str, model: str, created: int, result: CompletionResult) -> dict:
    return sendable({"id": rid, "object": "chat.completion.chunk" if p.chat else "text_completion", "created": created,
                     "model": model, "choices": [], "usage": usage(result)})


def model_card(model_id: str, info) -> dict:
    """An entry of GET /v1/models; meta.untuned, the note, while its split is a guess (read each time: it goes once tuned)."""
    untuned = untuned_note_of_file(getattr(info, "model_path", None))
    return sendable({"id": model_id, "object": "model", "created": int(time.time()), "owned_by": "ridgefill-desktop",
            "meta": {"name": info.model_name, "architecture": info.architecture, "n_layer": info.n_layer,
                     "n_ctx": info.n_ctx, "n_ctx_train": info.n_ctx_train, "default_split": info.default_split,
                     "default_tail": info.default_tail, "default_mode": getattr(info, "default_mode", DEFAULT_MODE),
                     **({"untuned": untuned} if untuned else {})}})
