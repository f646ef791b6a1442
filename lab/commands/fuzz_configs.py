"""`python -m lab fuzz-configs [--examples N] [--seed S] [--config NAME]`: random files in the place of each config
file (settings.json, servers.json, the user's model list; issue 65, item 5), each loaded as the app loads it. What
loads must be the file's value or the default, field by field; a file with anything wrong is kept whole as
NAME.bad-<time>, and the file left behind loads the same again with nothing more set aside; then a write through
the app's own writer keeps what loaded. Anything else (an exception included) is a finding, counted with its
input, and the run goes on. Inputs: any JSON (numbers past a float's range, NaN, lone surrogates, NUL, nesting
thousands deep inside an object), each file's own shape with values of any type, not JSON, not UTF-8."""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import fields
from pathlib import Path

from lab.fuzz_report import add_options, hypothesis_missing, report
from lab.fuzz_run import run_inputs

CONFIGS = ("settings", "servers", "models")
SETTINGS = {"threads": 2, "n_ctx": 512, "max_tokens": 256, "model_path": "/m.gguf", "hub_token": "t", "split": 3,
            "tail": 0, "ridgefill_on": True, "compare_exact": False, "prompt_cache_gb": 20,
            "generation": {"m.gguf": {"temperature": 0.7, "top_k": 40, "dry_sequence_breakers": ["\n"]}}}
SERVER = {"url": "http://h:8080/v1", "model": "m", "api_key": "k", "ours": True, "n_layer": 30, "default_split": 12,
          "default_tail": 64}
MODEL = {"id": "user-model", "name": "m", "architecture": "llama", "repo_id": "o/r", "filename": "m.gguf",
         "size_bytes": 5, "context_length": 512, "size_exact": False, "local_path": None}


def strategies() -> dict:
    """config name -> the strategy of its files' bytes."""
    from hypothesis import strategies as st

    text = st.lists(st.one_of(st.characters(codec=None), st.sampled_from(["\ud800", "\udfff", "\0"])),
                    max_size=10).map("".join)  # st.text() leaves lone surrogates out
    number = st.integers() | st.sampled_from([10**400, -10**400, 2**63, 2**31, 4097, -1, 0]) | st.floats()
    anything = st.recursive(st.none() | st.booleans() | number | text,
                            lambda c: st.lists(c, max_size=4) | st.dictionaries(text, c, max_size=4), max_leaves=16)
    deep = st.integers(1, 5_000).map(lambda n: '{"generation": ' + '{"a": ' * n + "1" + "}" * (n + 1))

    def shaped(template: dict):
        keys = st.sampled_from(sorted(template))
        return st.builds(lambda changes, drop: {**{k: v for k, v in template.items() if k not in drop}, **changes},
                         st.dictionaries(keys | text, anything, max_size=4), st.sets(keys, max_size=3))

    def listed(key: str, template: dict):
        return st.lists(shaped(template) | anything, max_size=3).map(lambda xs: {key: xs})

    def as_bytes(objects):
        files = objects.map(lambda o: json.dumps(o).encode())
        return st.one_of(files, files, anything.map(lambda o: json.dumps(o).encode()), deep.map(str.encode),
                         st.binary(max_size=80), st.binary(max_size=40).map(lambda b: b"\xef\xbb\xbf{" + b))

    return {"settings": as_bytes(shaped(SETTINGS)), "servers": as_bytes(listed("servers", SERVER) | shaped({"servers": []})),
            "models": as_bytes(listed("models", MODEL) | shaped({"models": []}))}


def _object(data: bytes):
    """The JSON object the file holds, as the app reads it, or None."""
    from backend.json_file import NotAnObject, parse_object

    try:
        return parse_object(data.decode("utf-8-sig"), "the file")
    except (NotAnObject, UnicodeDecodeError):
        return None


def _same_or_default(value, default, given: dict | None, key: str) -> bool:
    """`value` is the default, or the file's own value for `key` (of the same type: JSON's 1 is no `true`)."""
    if type(value) is not type(default):
        return False
    return value == default or (given is not None and key in given and type(given[key]) is type(value)
                                and given[key] == value)


def _exactly(a, b) -> bool:
    return type(a) is type(b) and a == b


def _file_kept_or_set_aside(path: Path, data: bytes, again) -> str:
    """The file as it was, or its bytes kept whole beside it; loading `again` changes nothing more."""
    aside = list(path.parent.glob(path.name + ".bad-*"))
    if not aside:
        assert path.read_bytes() == data, "a file changed without a copy kept"
        return "kept"
    assert len(aside) == 1 and aside[0].read_bytes() == data, "a set-aside file lost its bytes"
    assert aside[0].stat().st_mode & 0o077 == 0, "a set-aside copy others can read"
    before = path.read_bytes() if path.exists() else None
    again()
    assert len(list(path.parent.glob(path.name + ".bad-*"))) == 1, "what was left behind was set aside again"
    assert (path.read_bytes() if path.exists() else None) == before, "loading again changed the file"
    return "repaired" if path.exists() else "set aside"


def check_settings(data: bytes, work: Path) -> str:
    from app.settings import Settings

    path = work / "settings.json"
    path.write_bytes(data)

    class At(Settings):
        @classmethod
        def path(cls) -> Path:
            return path

    s, default, given = At.load(), At(), _object(data)
    for f in fields(Settings):
        value = getattr(s, f.name)
        if f.name == "generation":
            assert isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()), value
            json.dumps(value)  # writable back
        else:
            assert _same_or_default(value, getattr(default, f.name), given, f.name), (f.name, value)
    assert s.threads <= 4096 and s.n_ctx < 2**31 and math.isfinite(float(s.prompt_cache_bytes()))
    outcome = _file_kept_or_set_aside(path, data, At.load)  # load leaves a wrong value to the next save
    s.save()
    assert At.load() == s and path.stat().st_mode & 0o077 == 0
    if outcome == "kept" and list(work.glob("settings.json.bad-*")):
        outcome = _file_kept_or_set_aside(path, data, lambda: At.load().save()) + " at save"
    return outcome


def check_servers(data: bytes, work: Path) -> str:
    before = os.environ.get("RIDGEFILL_CONFIG_DIR")
    os.environ["RIDGEFILL_CONFIG_DIR"] = str(work)  # the app's own setting for where servers.json lives
    try:
        return _check_servers(data)
    finally:  # a test process goes on with its own config folder
        if before is None:
            os.environ.pop("RIDGEFILL_CONFIG_DIR", None)
        else:
            os.environ["RIDGEFILL_CONFIG_DIR"] = before


def _check_servers(data: bytes) -> str:
    from app import remote_servers as rs

    path = rs.servers_path()
    path.write_bytes(data)
    servers, given = rs.load_servers(), _object(data)
    entries = given.get("servers") if given else None
    for s in servers:
        matches = [e for e in entries if isinstance(e, dict) and e.get("model") == s.model]
        assert matches and isinstance(s.url, str), s
        for k, default in rs.SERVER_DEFAULTS.items():
            assert any(_same_or_default(getattr(s, k), default, e, k) for e in matches), (k, s)
    outcome = _file_kept_or_set_aside(path, data, rs.load_servers)
    new = rs.RemoteServer("http://new/v1", "n")
    assert rs.add_server(new)[-1] == new
    assert rs.load_servers() == [x for x in servers if (x.url, x.model) != (new.url, new.model)] + [new]
    return outcome


def check_models(data: bytes, work: Path) -> str:
    from backend.hub.catalogue import ModelEntry, add_hub, find_entry, load_catalogue, read_user_items

    path = work / "user_models.json"
    path.write_bytes(data)
    builtin, entries, given = load_catalogue(None), load_catalogue(path), _object(data)
    assert entries[:len(builtin)] == builtin
    for e in entries[len(builtin):]:  # each the file's own values, the defaults for the fields it left out
        same = [d for d in given["models"] if isinstance(d, dict) and d.get("id") == e.id and all(
            _exactly(getattr(e, f.name), d.get(f.name, f.default)) for f in fields(ModelEntry) if f.name != "source")]
        assert same, e
        assert find_entry(e.id, entries).id == e.id and math.isfinite(float(e.size_bytes or 0))
    outcome = _file_kept_or_set_aside(path, data, lambda: load_catalogue(path))
    before = [d for d in read_user_items(path) if not (isinstance(d, dict) and d.get("id") == "o-x")]
    add_hub("o/r", "x.gguf", path)
    assert json.dumps(read_user_items(path)[:-1]) == json.dumps(before) and find_entry("o-x", load_catalogue(path))
    return outcome


CHECKS = {"settings": check_settings, "servers": check_servers, "models": check_models}


def run_config(name: str, examples: int, seed: int, minutes: float = 0, batch: int = 8) -> dict:
    """`examples` files for one config (fewer when `minutes` run out): the outcomes and findings counted."""
    return run_inputs(name, strategies()[name], CHECKS[name], examples, seed, minutes, batch=batch, skip_repeats=True)


def register(sub) -> None:
    p = sub.add_parser("fuzz-configs", help="fuzz the config files (settings, servers, model list) (needs hypothesis)")
    add_options(p, 1000, "files per config")
    p.add_argument("--config", action="append", choices=CONFIGS, help="only this config (repeatable)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Exit 0 when every file loaded as its values or the defaults and nothing raised."""
    import logging

    if hypothesis_missing("fuzz-configs"):
        return 2
    logging.disable(logging.WARNING)  # every file set aside logs a warning: thousands of lines otherwise
    findings = 0
    for name in args.config or CONFIGS:
        started = time.perf_counter()
        stats = run_config(name, args.examples, args.seed, args.minutes)
        findings += report(name, stats, time.perf_counter() - started, args.seed, unit="files")
    return 1 if findings else 0
