"""The OpenAI-compatible server (app/server), driven by the official `openai` client against the real
server on a loopback port, in front of the embedded model in an engine process: answers streamed and
not, with timings; each bad input gets its status; a client that disconnects mid-stream frees the
engine; a small load test; the bind rule."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from backend.ridgefill.defaults import DEFAULT_MODE  # noqa: E402
from app.server.schema import ApiError, Defaults, parse_request  # noqa: E402
from backend.sampling import APP_DEFAULTS, GREEDY  # noqa: E402

DOC = ("Notes from the island survey. The lighthouse keeper's cat is named Biscuit. The old pier is 140 metres "
       "long. The survey boat is painted green.")
QUESTION = "What is the cat's name?"
KEY = "test-key-123"


def doc_messages(question: str = QUESTION) -> list[dict]:
    return [{"role": "user", "content": f"Read this document.\n\n{DOC}\n\nQuestion: {question}"}]


@pytest.fixture(scope="module")
def gateway(model_path):
    from app.engine_protocol import EngineSettings
    from app.server.gateway import ProcessGateway

    gw = ProcessGateway(EngineSettings(model_path, n_ctx=2048, n_batch=256, warm_up=False)).start()
    gw.wait_ready()
    yield gw
    gw.close()


def start(gateway, **kw):
    from app.server.runner import LocalServer

    # Greedy when a request leaves sampling out (as `serve --greedy`): these tests compare answers across
    # requests. What a plain `serve` gives is test_left_out_sampling_is_the_models_default.
    return LocalServer(gateway, defaults=Defaults(DEFAULT_MODE, sampling=GREEDY), port=0, **kw).start()


@pytest.fixture(scope="module")
def server(gateway):
    srv = start(gateway)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def health(server) -> dict:
    with urllib.request.urlopen(server.url + "/health", timeout=10) as r:
        return json.loads(r.read())


def wait_idle(server, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while (h := health(server))["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return h


def post_raw(server, path: str, data: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(server.url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---- answers -------------------------------------------------------------------------------------
def test_models_and_health(server, client, model, gateway):
    assert model == "SmolLM2-135M-Instruct.Q4_1"
    assert client.models.retrieve(model).id == model
    h = health(server)
    assert h["status"] == "ok" and h["model"] == model and h["in_flight"] == 0


def test_chat_about_a_document_with_timings_and_prefix_reuse(client, model):
    resp = client.chat.completions.create(model=model, messages=doc_messages(), max_tokens=12)
    answer = resp.choices[0].message.content
    assert answer.strip() and resp.choices[0].finish_reason in ("stop", "length")
    assert "Biscuit" in answer  # greedy: the fact from the document
    t = resp.timings  # llama.cpp server's timings object, with RidgeFill's fields
    for name in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n", "ttft_ms", "mode", "split",
                 "tail", "bulk_n", "exact_n", "note"):
        assert name in t
    assert t["predicted_n"] == resp.usage.completion_tokens
    assert resp.usage.prompt_tokens == t["prompt_n"] + t["cache_n"]
    assert t["mode"] == "off" and "nothing to win" in t["note"]  # a short document runs exact, and says so

    again = client.chat.completions.create(model=model, messages=doc_messages("How long is the old pier?"),
                                           max_tokens=4)
    assert again.timings["cache_n"] > 0  # the document is reused from the first request's cache


def test_chat_streamed_with_timings_and_usage(client, model):
    stream = client.chat.completions.create(model=model, messages=doc_messages(), max_tokens=12, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Biscuit" in text
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert last.timings["predicted_n"] > 0 and "ttft_ms" in last.timings
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == last.timings["predicted_n"]


def test_completions_with_a_stop_sequence(client, model):
    prompt = "Monday, Tuesday, Wednesday,"
    full = client.completions.create(model=model, prompt=prompt, max_tokens=12).choices[0].text
    stop = full[len(full) // 2: len(full) // 2 + 3]  # a stop sequence the (greedy) answer runs into
    resp = client.completions.create(model=model, prompt=prompt, max_tokens=12, stop=[stop])
    assert resp.choices[0].text == full[: full.find(stop)] and resp.choices[0].finish_reason == "stop"
    assert resp.timings["predicted_n"] >= 1
    streamed = client.completions.create(model=model, prompt=prompt, max_tokens=12, stop=[stop], stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == resp.choices[0].text


@pytest.mark.slow
def test_ridgefill_options_reach_the_engine(client, model):
    """speed at split 21 (maps shipped in maps_cache/) and tail 256 on ~1,400 tokens: the timings say so."""
    from backend.corpus import corpus_texts

    doc = "\n\n".join(corpus_texts())[:5600]
    resp = client.chat.completions.create(
        model=model, max_tokens=2, messages=[{"role": "user", "content": doc + "\n\nWho wrote this?"}],
        extra_body={"ridgefill": {"mode": "speed", "split": 21, "tail": 256, "reuse_prefix": False}})
    t = resp.timings
    assert (t["mode"], t["split"], t["tail"]) == ("speed", 21, 256), t["note"]
    assert t["bulk_n"] > 1024 and t["cache_n"] == 0


@pytest.mark.slow
def test_a_client_may_wait_for_the_answers_check_against_exact(client, model):
    """ridgefill.check: the answer comes back once the engine has made the document exact and checked it;
    the reply carries the verdict, both answers and the ΔNLL (backend/answer_check.py)."""
    from backend.corpus import corpus_texts

    doc = "\n\n".join(corpus_texts())[:5600]
    resp = client.chat.completions.create(
        model=model, max_tokens=8, messages=[{"role": "user", "content": doc + "\n\nWho wrote this?"}],
        extra_body={"ridgefill": {"mode": "speed", "split": 21, "tail": 256, "reuse_prefix": False, "check": True}})
    check = resp.model_extra["check"]
    assert resp.timings["bulk_n"] > 1024  # rows were approximated: there was something to check
    assert check["verdict"] in ("checked", "corrected") and check["shown_answer"] == resp.choices[0].message.content
    assert isinstance(check["exact_answer"], str) and check["dnll"] is not None
    plain = client.chat.completions.create(model=model, max_tokens=2, messages=[{"role": "user", "content": "Hi"}])
    assert "check" not in (plain.model_extra or {})  # only when asked


# ---- sampling -------------------------------------------------------------------------------------
# Greedy's poem says "a", "tale" and "," again within 24 tokens: each penalty changes it (the list of days did
# not move for presence_penalty 2: the penalties count the answer only, and its margins are wide).
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


def completion(client, model, **kw) -> str:
    return client.chat.completions.create(model=model, messages=POEM, max_tokens=24, **kw).choices[0].message.content


def test_each_sampling_parameter_reaches_the_sampler(client, model):
    greedy = completion(client, model)  # this server's default: greedy
    hot = completion(client, model, temperature=2.0, seed=11)
    assert hot != greedy  # temperature
    assert completion(client, model, temperature=2.0, seed=11) == hot  # seed: the same draw again
    assert completion(client, model, temperature=2.0, seed=12) != hot  # and another seed, another draw
    # each of these leaves only the most likely token, so even at temperature 2 the answer is greedy's
    assert completion(client, model, temperature=2.0, seed=11, top_p=0.0) == greedy
    for only_the_top in ({"top_k": 1}, {"min_p": 1.0}):  # llama.cpp's, as extra body fields
        assert completion(client, model, temperature=2.0, seed=11, extra_body=only_the_top) == greedy, only_the_top
    # each penalty (at temperature 0) moves the answer off its repeated words
    assert completion(client, model, presence_penalty=2.0) != greedy
    assert completion(client, model, frequency_penalty=2.0) != greedy
    assert completion(client, model, extra_body={"repeat_penalty": 2.0}) != greedy
    assert completion(client, model, extra_body={"repeat_penalty": 2.0, "repeat_last_n": 0}) == greedy  # no window


def test_each_dry_parameter_reaches_the_sampler(client, model):
    """A 104-token line copied again and again (greedy): DRY breaks the copy; each of its parameters, set so
    that DRY cannot act, gives greedy's answer back, and a steeper base another answer."""
    from tests.test_sampling import COPYING

    def text(**extra) -> str:
        return client.completions.create(model=model, prompt=COPYING, max_tokens=160,
                                         extra_body=extra).choices[0].text

    greedy = text()  # this server's default: greedy, DRY off
    dry = text(dry_multiplier=0.8)
    assert dry != greedy
    for cannot_act in ({"dry_penalty_last_n": 0}, {"dry_penalty_last_n": 64},  # 64: shorter than the repeat
                       {"dry_allowed_length": 200}, {"dry_sequence_breakers": [" "]}):  # a word cannot repeat
        assert text(dry_multiplier=0.8, **cannot_act) == greedy, cannot_act
    assert text(dry_multiplier=0.8, dry_base=4.0) not in (greedy, dry)


@pytest.mark.parametrize("field, value", [
    ("temperature", 2.5), ("temperature", "hot"), ("top_p", 1.5), ("top_k", -1), ("top_k", 4.5), ("min_p", -0.1),
    ("repeat_penalty", 0), ("repeat_last_n", -2), ("presence_penalty", 3), ("frequency_penalty", -2.5),
    ("seed", -2), ("seed", "lucky"),
    ("dry_multiplier", -0.1), ("dry_multiplier", 6), ("dry_base", 0.5), ("dry_allowed_length", 0),
    ("dry_allowed_length", 2.5), ("dry_penalty_last_n", -2), ("dry_sequence_breakers", "\n"),
    ("dry_sequence_breakers", [1]), ("dry_sequence_breakers", [""]), ("dry_sequence_breakers", ["x"] * 33),
])
def test_a_wrong_sampling_value_gets_400(server, field, value):
    status, body = post_raw(server, "/v1/chat/completions", json.dumps({"messages": POEM, field: value}).encode())
    assert status == 400 and body["error"]["param"] == field, body
    assert body["error"]["code"] in ("invalid_value", "invalid_type") and field in body["error"]["message"]


def test_left_out_sampling_is_the_models_default():
    """A plain `serve` (Defaults without sampling): what a request leaves out is the model's default, its
    file's recommendation over the app's set, as in the GUI; what it gives wins."""
    def parsed(body, recommended=()):
        return parse_request({"prompt": "x", **body}, chat=False, defaults=Defaults(DEFAULT_MODE),
                             recommended=recommended).request

    assert parsed({}).sampling == APP_DEFAULTS
    assert parsed({}, (("temperature", 0.6), ("top_k", 20))).sampling.temperature == 0.6
    req = parsed({"temperature": 0.5, "top_k": 5, "stop": ["\n"]})
    assert (req.sampling.temperature, req.sampling.top_k, req.sampling.top_p) == (0.5, 5, APP_DEFAULTS.top_p)
    assert req.stop == ["\n"] and not req.stop_loops  # stop strings reach the engine; a client's loop is its own
    with pytest.raises(ApiError):
        parsed({"min_p": 2})


def test_left_out_mode_is_the_served_models_default(small_engine):
    """A plain `serve` (Defaults without a mode) asks for the model's own mode, which the engine's planner
    resolves beside split and tail (SmolLM2: exact, its measured default); `serve --mode` and the body win."""
    from backend.ridgefill.defaults import default_mode
    from backend.ridgefill.plan import plan_prefill

    def mode(body, defaults=Defaults()):
        return parse_request({"prompt": "x", **body}, chat=False, defaults=defaults).request.mode

    assert mode({}) == "default" and mode({"ridgefill": {"mode": "default"}}) == "default"
    assert mode({}, defaults=Defaults("quality")) == "quality"
    assert mode({"ridgefill": {"mode": "off"}}) == "off"
    request = parse_request({"prompt": "x"}, chat=False, defaults=Defaults()).request
    plan = plan_prefill(small_engine, request, 4096)
    assert default_mode(small_engine.info) == "off" and plan.note.startswith("measured: no RidgeFill setting keeps")


def test_the_models_list_says_the_default_mode(server, gateway):
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
        meta = json.load(r)["data"][0]["meta"]
    assert meta["default_mode"] == gateway.info.default_mode == "off"  # the suite's model, SmolLM2: exact (measured)


# ---- bad input ------------------------------------------------------------------------------------
def test_malformed_json_and_fields_get_400(server, client, model):
    status, body = post_raw(server, "/v1/chat/completions", b'{"messages": [')
    assert status == 400 and body["error"]["code"] == "invalid_json"
    bad = [
        dict(messages=[]),
        dict(messages=[{"role": "robot", "content": "hi"}]),
        dict(messages=doc_messages(), max_tokens=0),
        dict(messages=doc_messages(), temperature="hot"),
        dict(messages=doc_messages(), n=2),
        dict(messages=doc_messages(), extra_body={"ridgefill": {"mode": "turbo"}}),
        dict(messages=doc_messages(), extra_body={"ridgefill": {"split": 99}}),
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=model, **kw)
        assert e.value.status_code == 400 and e.value.body["message"], kw
    assert health(server)["in_flight"] == 0


def test_a_prompt_longer_than_the_context_gets_400_with_token_counts(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, max_tokens=8,
                                       messages=[{"role": "user", "content": "lorem ipsum " * 1500}])
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["n_ctx"] == 2048 and err["n_prompt_tokens"] > 2048
    assert f"{err['n_prompt_tokens']:,}" in err["message"]
    with pytest.raises(openai.BadRequestError):  # streamed: the 400 comes before any chunk
        list(client.chat.completions.create(model=model, max_tokens=8, stream=True,
                                            messages=[{"role": "user", "content": "lorem ipsum " * 1500}]))


def test_unknown_model_gets_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=doc_messages(), max_tokens=2)
    assert e.value.body["code"] == "model_not_found"


def test_a_key_is_required_when_set(gateway):
    srv = start(gateway, api_key=KEY)
    try:
        wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            wrong.chat.completions.create(model="x", messages=doc_messages(), max_tokens=2)
        assert e.value.body["code"] == "invalid_api_key"
        status, body = post_raw(srv, "/v1/chat/completions", json.dumps({"messages": doc_messages()}).encode())
        assert status == 401 and body["error"]["code"] == "missing_api_key"  # no Authorization header
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
        assert ok.models.list().data
        assert health(srv)["status"] == "ok"  # /health needs no key
    finally:
        srv.stop()


def test_bind_rule(capsys):
    from app.cli import run_cli
    from app.server.runner import check_bind, is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("localhost") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.20")
    check_bind("0.0.0.0", KEY)  # a key makes it allowed
    assert run_cli(["serve", "--host", "0.0.0.0"]) == 2  # refused before the model loads
    assert "without an API key" in capsys.readouterr().err


# ---- disconnects, the queue, load -----------------------------------------------------------------
def test_a_client_that_disconnects_mid_stream_frees_the_engine(gateway):
    srv = start(gateway, max_queue=1)
    try:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        model = c.models.list().data[0].id
        stream = c.chat.completions.create(model=model, messages=[{"role": "user", "content": "Tell a long story."}],
                                           max_tokens=1000, stream=True, extra_body={"ridgefill": {"mode": "off"}})
        got = 0
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 3:
                break
        # the queue holds one request, and the story is running: the next is turned away with the reason
        with pytest.raises(openai.RateLimitError) as e:  # 429: too many requests, not a fault; openai retries it
            c.chat.completions.create(model=model, messages=doc_messages(), max_tokens=2)
        assert e.value.status_code == 429 and e.value.body["code"] == "queue_full"
        t0 = time.monotonic()
        stream.close()  # the client goes away mid-stream
        h = wait_idle(srv, 20)
        assert h["in_flight"] == 0 and h["stats"]["cancelled_client_gone"] == 1
        assert time.monotonic() - t0 < 15  # 1,000 tokens would take far longer: the story was stopped
        resp = c.chat.completions.create(model=model, messages=doc_messages(), max_tokens=4)
        assert resp.choices[0].message.content and resp.timings["predicted_n"] > 0
    finally:
        srv.stop()


def test_small_load(server):
    from lab.server_load.load import run_load

    report = run_load(server.url, clients=3, requests=2, max_tokens=4)
    s = report.summary()
    assert s["sent"] == 6 and s["lost"] == 0 and s["answered"] + s["rejected"] == 6, s
    assert s["answered"] == 6  # the queue (16) holds them all
    assert report.healthy_after, s


def test_health_shows_the_prompt_cache_the_v1_requests_share(server, client, model):
    from backend.prompt_cache import DEFAULT_LIMIT_BYTES

    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=2)
    deadline = time.monotonic() + 60
    while "prompt_cache" not in (h := health(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    pc = h["prompt_cache"]
    assert pc["tokens"] > 0 and pc["line"].startswith("document ") and pc["cache_limit"] == DEFAULT_LIMIT_BYTES
