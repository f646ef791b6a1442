"""Issue 65, item 5: settings.json, servers.json and the user's model list of any shape or value. What is wrong
gets its default, the file is kept as NAME.bad-<time> and the user told (backend/json_file.notices, beside the
log); the app starts. The three are read, changed and written under a file lock, so two processes never lose
each other's writes; files an earlier version left 0644/0755 are made private when read."""
from __future__ import annotations

import json
import multiprocessing
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend import json_file

HUGE = st.integers(min_value=-10**400, max_value=10**400) | st.sampled_from([10**400, 2**63, 2**31, -1])
JSON = st.recursive(st.none() | st.booleans() | HUGE | st.floats() | st.text(max_size=6),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
                    max_leaves=8)


def copies(path) -> list:
    return sorted(path.parent.glob(path.name + ".bad-*"))


def test_settings_with_wrong_values_get_defaults_the_file_kept_aside_and_a_notice():
    from app.settings import Settings

    path = Settings.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"threads": 10**30, "n_ctx": 4096, "split": True, "newer": 1,
                       "generation": {"m.gguf": {"temperature": 10**400, "top_k": 5}, "x": 3}})
    path.write_text(text)
    json_file.notices(clear=True)
    s = Settings.load()
    assert (s.threads, s.n_ctx, s.split, s.generation) == (0, 4096, 0, {"m.gguf": {"top_k": 5}})
    assert path.read_text() == text and "threads" in json_file.notices(clear=True)[0]  # told at start
    s.save()  # mended by the next save, under the lock (another window may be writing it)
    (kept,) = copies(path)
    assert kept.read_text() == text and kept.stat().st_mode & 0o077 == 0
    assert json.loads(path.read_text()) == {"n_ctx": 4096, "newer": 1, "generation": {"m.gguf": {"top_k": 5}}}
    (notice,) = json_file.notices(clear=True)
    assert "threads" in notice and kept.name in notice
    assert Settings.load() == s and not json_file.notices() and len(copies(path)) == 1  # mended: said once


def test_servers_with_wrong_values_get_defaults_the_file_kept_aside_and_a_notice():
    from app.remote_servers import RemoteServer, load_servers, servers_path

    path = servers_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"servers": [{"url": "http://h/v1", "model": "m", "api_key": 5, "ours": "yes",
                                    "n_layer": 10**400}, 7]})
    path.write_text(text)
    json_file.notices(clear=True)
    assert load_servers() == [RemoteServer("http://h/v1", "m")]  # before: api_key "5", ours True, no notice
    (kept,) = copies(path)
    assert kept.read_text() == text and "2 server entries" in json_file.notices(clear=True)[0]
    assert load_servers() == [RemoteServer("http://h/v1", "m")] and not json_file.notices()


def test_a_model_entry_with_a_number_no_float_holds_is_skipped_and_said(tmp_path):
    from backend.hub.catalogue import load_catalogue

    user = tmp_path / "user_models.json"
    entry = {"id": "big", "name": "n", "architecture": "", "repo_id": "o/r", "filename": "f.gguf"}
    user.write_text(json.dumps({"models": [{**entry, "size_bytes": 10**400}, {**entry, "id": "ok", "size_bytes": 5}]}))
    json_file.notices(clear=True)
    ids = [e.id for e in load_catalogue(user)]
    assert "ok" in ids and "big" not in ids  # before: 10**400 bytes reached the panel's size / 1e9 (OverflowError)
    assert "skipped" in json_file.notices(clear=True)[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.dictionaries(st.sampled_from(["threads", "n_ctx", "max_tokens", "model_path", "hub_token", "split",
                                             "ridgefill_on", "generation", "prompt_cache_gb", "other"]), JSON))
def test_settings_of_any_values_load_as_those_values_or_defaults(data):
    from dataclasses import fields

    from app.settings import Settings

    for p in Settings.path().parent.glob("settings.json*"):
        p.unlink()
    Settings.path().parent.mkdir(parents=True, exist_ok=True)
    Settings.path().write_text(json.dumps(data))
    s, default = Settings.load(), Settings()
    for f in fields(Settings):
        value = getattr(s, f.name)
        assert value == getattr(default, f.name) or value == data.get(f.name) or f.name == "generation"
        assert type(value) is type(getattr(default, f.name))
    assert s.threads <= 4096 and s.n_ctx < 2**31 and s.prompt_cache_gb * 10**9 / 1e9 >= 0  # floats hold them
    s.save()
    assert Settings.load() == s


def _add_servers(home: str, tag: str, n: int) -> None:
    os.environ["RIDGEFILL_HOME"] = home
    from app.remote_servers import RemoteServer, add_server

    for i in range(n):
        add_server(RemoteServer(f"http://{tag}{i}/v1", "m"))


def _add_models(path: str, tag: str, n: int) -> None:
    from backend.hub.catalogue import add_hub

    for i in range(n):
        add_hub(f"{tag}/r", f"x{i}.gguf", path)


def test_two_processes_adding_servers_and_models_keep_every_one(tmp_path):
    """Before: each read the file, added, and wrote it whole; the later writer dropped what the other added."""
    from app.remote_servers import load_servers
    from backend.hub.catalogue import read_user_items

    home, models, n = str(tmp_path / "home"), str(tmp_path / "user_models.json"), 25
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add_servers, args=(home, tag, n)) for tag in "ab"]
    procs += [ctx.Process(target=_add_models, args=(models, tag, n)) for tag in "cd"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    os.environ["RIDGEFILL_HOME"] = home
    assert len(load_servers()) == 2 * n
    assert len(read_user_items(models)) == 2 * n


def test_config_files_an_earlier_version_left_open_are_made_private():
    from app.remote_servers import load_servers, servers_path
    from app.settings import Settings

    folder = Settings.path().parent
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o755)
    for path in (Settings.path(), servers_path()):
        path.write_text("{}")
        os.chmod(path, 0o644)
    Settings.load()
    load_servers()
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in (Settings.path(), servers_path()))
