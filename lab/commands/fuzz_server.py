"""`python -m lab fuzz-server`: the server's request bodies fuzzed against its parsing layer, in-process.

Every input (a chat/completions or completions body with each field of any JSON type, NaN and Infinity,
huge and boundary numbers, long strings, deep nesting, or plain bytes) must give a parsed request whose
values are all within their bounds, or an ApiError with a 4xx status: never another exception. The
suite runs the same property briefly (tests/test_fuzz_server.py); this runs it long and prints the inputs
tried, the crashes (each kind once, with its input) and the peak memory. Hypothesis is a test extra:
it is imported only when the command runs.
"""
from __future__ import annotations

import json
import math
import time

from app.server.schema import MAX_TOKEN_COUNT, ApiError, Defaults, Parsed, decode_body, parse_request
from backend.sampling import RANGES, numeric_fields
from lab.fuzz_report import add_options, count, finding, hypothesis_missing, new_stats, report

N_LAYER = 30
ROLES = ["system", "developer", "user", "assistant"]
MODES = ["off", "speed", "quality", "guided", "plumb"]
FIELDS = ["model", "messages", "prompt", "n", "logprobs", "echo", "tools", "functions", "max_tokens",
          "max_completion_tokens", "stream", "stream_options", "stop", "ridgefill", "dry_sequence_breakers",
          "user", "logit_bias"] + [f.name for f in numeric_fields()]
# Where a wrong value goes: a top-level field, or one inside a message or the ridgefill object
PATHS = [(name,) for name in FIELDS] + [("messages", 0, "role"), ("messages", 0, "content"), ("messages", 0),
                                         ("messages", 0, "content", 0), ("stop", 0)] + [
    ("ridgefill", name) for name in ("mode", "split", "tail", "quality_share", "reuse_prefix", "other")]
EDGES = [0, 1, -1, -2, 2**31 - 1, 2**31, 2**63, -(2**63), 131_072, 131_073, MAX_TOKEN_COUNT + 1, 10**400,
         0.5, 2.0, 1e308, -0.0, 5e-324, float("nan"), float("inf"), float("-inf"), "", "x" * 5000, "user",
         "speed", "off", "\n", "\ud800", [], {}, None, True, False]


def _valid_fields(st) -> dict:
    """A strategy per field for values the server takes (and now and then text with a lone surrogate)."""
    def texts(**size):  # a JSON string may escape half a surrogate pair, which is not text
        return st.one_of(st.text(**size), st.text(**size), st.text(**size),
                         st.text(st.characters() | st.characters(categories=["Cs"]), **size))

    text = texts(max_size=40)
    part = st.fixed_dictionaries({"type": st.just("text"), "text": text})
    message = st.fixed_dictionaries({"role": st.sampled_from(ROLES), "content": text | st.lists(part, max_size=3)})
    tokens = st.integers(1, MAX_TOKEN_COUNT)
    out = {"messages": st.lists(message, min_size=1, max_size=3), "prompt": texts(min_size=1, max_size=40),
           "model": text, "n": st.just(1), "max_tokens": tokens, "max_completion_tokens": tokens,
           "stream": st.booleans(), "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
           "stop": texts(min_size=1, max_size=8) | st.lists(texts(min_size=1, max_size=8), max_size=4),
           "ridgefill": st.fixed_dictionaries({}, optional={
               "mode": st.sampled_from(MODES), "split": st.integers(1, N_LAYER - 1),
               "tail": st.integers(0, MAX_TOKEN_COUNT), "quality_share": st.floats(0, 1),
               "reuse_prefix": st.booleans()}),
           "dry_sequence_breakers": st.lists(texts(min_size=1, max_size=40), max_size=32),
           "logprobs": st.sampled_from([False, None, 0]), "echo": st.sampled_from([False, None]),
           "tools": st.just([]), "functions": st.none(), "user": text,
           "logit_bias": st.dictionaries(text, st.integers(-100, 100), max_size=2)}
    for f in numeric_fields():
        lo, hi = RANGES[f.name]
        out[f.name] = (st.floats(lo, hi) if f.type in ("float", float)
                       else st.integers(int(lo), int(hi) if hi is not None else 2**64))
    return out


def _put(node, path: tuple, value):
    """`node` (a body, or a list or object in it) with `value` at `path`, where the path exists; a missing
    top-level field is added."""
    if not isinstance(node, (dict, list)):
        return node
    key, copy = path[0], (dict(node) if isinstance(node, dict) else list(node))
    try:
        child = node[key]
    except (KeyError, IndexError, TypeError):
        if len(path) == 1 and isinstance(node, dict):
            copy[key] = value
        return copy
    copy[key] = value if len(path) == 1 else _put(child, path[1:], value)
    return copy


def strategies():
    """(bodies, raw bytes) strategies: valid bodies with one value made wrong (or none), and raw bodies
    (those bodies as JSON, NaN and all; deep nesting; random bytes). Hypothesis is imported here so that
    the command line runs without it."""
    from hypothesis import strategies as st

    scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20),
                       st.sampled_from(EDGES))
    junk = st.recursive(scalar, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
    fields = _valid_fields(st)
    required = {name: fields.pop(name) for name in ("messages", "prompt")}  # chat reads one, completions the other
    valid = st.fixed_dictionaries(required, optional=fields)
    body = st.tuples(valid, st.none() | st.sampled_from(PATHS), junk).map(  # about half left valid
        lambda t: t[0] if t[1] is None else _put(t[0], t[1], t[2]))
    as_json = body.map(lambda b: json.dumps(b, allow_nan=True).encode())
    nested = st.tuples(st.integers(0, 120_000), st.sampled_from([b"[", b'{"a":', b'{"messages":['])).map(
        lambda t: t[1] * t[0])
    raw = st.one_of(as_json, as_json, as_json, as_json, nested, st.binary(max_size=200))  # mostly bodies
    return body | junk, raw


def check(raw: bytes, chat: bool) -> Parsed | ApiError:
    """One input through the parsing layer: a parsed, in-bounds request or a 4xx ApiError; anything else raises."""
    try:
        parsed = parse_request(decode_body(raw), chat=chat, defaults=Defaults("off"), n_layer=N_LAYER)
    except ApiError as err:
        if not 400 <= err.status < 500:
            raise AssertionError(f"status {err.status} for a request body") from err
        json.dumps(err.body, allow_nan=False)  # what JSONResponse sends must serialize
        return err
    req = parsed.request
    req.sampling.check()  # every sampling field within RANGES (so NaN cannot have passed)
    assert 1 <= req.max_tokens <= MAX_TOKEN_COUNT and all(math.isfinite(v) for v in
                                                          (req.sampling.temperature, req.quality_share or 0.0))
    assert (req.messages is not None) == chat and (req.prompt is not None) != chat
    texts = [m.content for m in req.messages or ()] + [req.prompt or ""] + req.stop + list(
        req.sampling.dry_sequence_breakers)
    for text in texts:
        text.encode("utf-8")  # the engine tokenizes UTF-8: a lone surrogate would fail there, as a 500
    return parsed


def register(sub) -> None:
    p = sub.add_parser("fuzz-server", help="fuzz the server's request bodies against its parser (Hypothesis)")
    add_options(p, 100_000, minutes=False)
    p.set_defaults(func=run)


def run(args) -> int:
    if hypothesis_missing("fuzz-server"):
        return 2
    from hypothesis import HealthCheck, Phase, given, settings, seed
    from hypothesis import strategies as st

    _, raw = strategies()
    stats = new_stats()

    @seed(args.seed)
    @settings(max_examples=args.examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(raw, st.booleans())
    def one(data: bytes, chat: bool) -> None:
        started = time.perf_counter()
        try:
            outcome = "parsed" if isinstance(check(data, chat), Parsed) else "refused with a 4xx"
        except Exception as exc:  # noqa: BLE001 - counted and shown once per kind, the run goes on
            outcome = finding(stats, exc, data)
        count(stats, outcome, started)

    t0 = time.perf_counter()
    one()
    return 1 if report("fuzz-server", stats, time.perf_counter() - t0, args.seed) else 0
