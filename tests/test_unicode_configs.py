"""Issue 65, item 1: any Unicode a config file, a prompt-cache entry's header or a server's reply holds either
round-trips or is replaced and said so. The text below includes lone surrogates (see ANY_TEXT), which a document,
a server's "\\ud800" escape or a file name undecodable as UTF-8 bring in.

A high half followed by a low half ("\\ud800\\udc00", two code points in Python) is one character in UTF-16 and
in JSON, whose escapes are UTF-16: it reads back as that character (U+10000), as any JSON reader reads it.
`joined` says so; every other string must come back exactly."""
from __future__ import annotations

import json
import logging
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.responses import JSONResponse

LONE = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
# Every code point, NUL and lone surrogates. Hypothesis 6.170's st.text() drops surrogates even from an alphabet of
# st.characters(codec=None) (0 strings with one in 300; 3 with LONE mixed in): a list joined keeps them (262 in 300).
ANY_TEXT = st.lists(st.one_of(st.characters(codec=None), LONE, st.just("\0")), max_size=12).map("".join)
def joined(text: str) -> str:
    """`text` with each high-then-low surrogate pair as the one character it encodes (lone halves stay)."""
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


SOME = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SOME
@given(token=ANY_TEXT, endpoint=ANY_TEXT, model=ANY_TEXT, breaker=ANY_TEXT)
def test_any_text_round_trips_through_settings_or_is_refused_and_said(token, endpoint, model, breaker):
    from app.settings import Settings
    from backend import json_file

    Settings.path().unlink(missing_ok=True)
    s = Settings(hub_token=token, hub_endpoint=endpoint, generation={model: {"dry_sequence_breakers": [breaker]}})
    s.save()
    json_file.notices(clear=True)
    back = Settings.load()
    nul = "\0" in token + endpoint + breaker  # the one character refused: a path or token cannot hold it
    if not nul:
        assert (back.hub_token, back.hub_endpoint) == (joined(token), joined(endpoint))
        assert back.generation == {joined(model): {"dry_sequence_breakers": [joined(breaker)]}}
    else:
        assert any(Settings.path().name in n for n in json_file.notices(clear=True))


@SOME
@given(url=ANY_TEXT, model=ANY_TEXT, key=ANY_TEXT)
def test_any_text_round_trips_through_servers_json(url, model, key):
    from app.remote_servers import RemoteServer, add_server, load_servers, servers_path, without_credentials

    servers_path().unlink(missing_ok=True)
    server = RemoteServer("http://h/v1" + url, model, key)
    add_server(server)
    saved = without_credentials(server)
    assert load_servers() == [RemoteServer(joined(saved.url), joined(model), joined(saved.api_key))]


@SOME
@given(name=ANY_TEXT, notes=ANY_TEXT, path=ANY_TEXT)
def test_any_text_round_trips_through_the_users_model_list(tmp_path, name, notes, path):
    from backend import json_file
    from backend.hub import catalogue

    user = tmp_path / "user_models.json"
    user.unlink(missing_ok=True)
    entry = catalogue.ModelEntry(id="mine", name=name, architecture="llama", repo_id=None, filename="m.gguf",
                                 local_path="/m" + path, source="user", notes=notes)
    catalogue._save_user(user, entry)
    if "\0" not in name + notes + path:
        assert catalogue.load_catalogue(user)[-1] == replace(entry, name=joined(name), notes=joined(notes),
                                                            local_path=joined(entry.local_path))
    else:  # a NUL: no path or name holds one; the entry is skipped (kept in the file) and the user told
        assert catalogue.load_catalogue(user) == catalogue.load_catalogue(None)
        assert any("skipped" in n for n in json_file.notices(clear=True))


@SOME
@given(name=ANY_TEXT)
def test_any_model_name_round_trips_through_a_prompt_cache_entrys_header(tmp_path, name):
    from backend.prompt_cache import Build, PromptCache

    cache = PromptCache(tmp_path / "p", limit_bytes=10**6)
    facts = {"tokens": [1, 2], "approximated": [], "n_clean": 2, "stream_split": None}
    cache.save(model_key="k", model_name=name, build=Build("t", "00"), state=bytearray(16), facts=facts, arrays={})
    assert [e.header["model_name"] for e in cache.entries()] == [joined(name)]


def _reply_parts(text: str, doc_text: str):
    from app.server.schema import Parsed, chunk, response
    from backend.protocol import CompletionResult, Timings
    from backend.sources import Source

    result = CompletionResult(text, "stop", Timings(), prompt_tokens=3,
                              sources=[Source("d" + doc_text, None, 0, 1, doc_text, 0.5)])
    for chat in (True, False):
        p = Parsed(request=None, chat=chat, include_usage=True)
        yield JSONResponse(response(p, "id", "m" + doc_text, 1, result)).body  # what api.py sends whole
        for c in (chunk(p, "id", "m", 1, text=text), chunk(p, "id", "m", 1, reason="stop", result=result)):
            yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode("utf-8")  # api.py's sse()


@settings(max_examples=60, deadline=None)
@given(before=ANY_TEXT, lone=LONE, after=ANY_TEXT)
def test_a_lone_surrogate_in_an_answer_or_a_source_is_sent_as_u_fffd_and_logged(before, lone, after):
    """Before: JSONResponse raised UnicodeEncodeError (a 500) and the stream's encode cut it off."""
    text = before + lone + after
    handler, disabled = _Seen(), logging.root.manager.disable
    logging.getLogger("app.server.schema").addHandler(handler)
    logging.disable(logging.NOTSET)  # a fuzz command run earlier in this process turned warnings off
    try:
        bodies = list(_reply_parts(text, text))
    finally:
        logging.getLogger("app.server.schema").removeHandler(handler)
        logging.disable(disabled)
    shown = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in text)
    for body in bodies:
        data = json.loads(body.decode("utf-8").removeprefix("data: "))
        assert shown in _strings(data)
    whole = json.loads(bodies[0])
    assert whole["choices"][0]["message"]["content"] == shown and whole["sources"][0]["text"] == shown
    assert any("U+FFFD" in m for m in handler.messages)


def _strings(data) -> list[str]:
    if isinstance(data, dict):
        return [s for v in data.values() for s in _strings(v)]
    if isinstance(data, list):
        return [s for v in data for s in _strings(v)]
    return [data] if isinstance(data, str) else []


class _Seen(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())
