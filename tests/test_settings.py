"""The user's settings reach the engine child and the hub code as typed values (app/settings.py), not
through the environment; the variables a user starts the app with still work where a setting is empty."""
from __future__ import annotations

import os
import time

from app.engine_process import EngineProcess
from app.engine_protocol import EngineFatal, EngineStarted
from app.settings import Settings
from backend import user_paths


def tuned_line(settings, timeout_s: float = 180) -> str:
    """The tuned split a real engine child found in its cache (EngineReady.tuned)."""
    proc = EngineProcess(settings, auto_restart=False)
    try:
        proc.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for msg in proc.poll():
                assert not isinstance(msg, EngineFatal), msg
                if isinstance(msg, EngineStarted):
                    return msg.ready.tuned
            time.sleep(0.05)
        raise AssertionError("the engine did not start in time")
    finally:
        proc.shutdown()


def test_the_cache_location_reaches_the_engine_child_and_wins_over_the_variable(tmp_path, monkeypatch, model_path):
    from backend.model_file import read_model_info
    from backend.ridgefill.tuned import write_tuned

    info = read_model_info(model_path)
    for cache, split in (("chosen", 7), ("from-the-shell", 9)):  # a tuned record in each cache tells them apart
        write_tuned(info, {"split": split, "chosen_by": f"the {cache} cache"}, root=tmp_path / cache / "maps")
    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(tmp_path / "from-the-shell"))
    s = Settings(model_path=model_path, n_ctx=512, threads=1, cache_location=str(tmp_path / "chosen"))
    es = s.engine_settings()
    assert (es.model_path, es.n_ctx, es.n_threads, es.cache_root) == (model_path, 512, 1, str(tmp_path / "chosen"))
    es.warm_up = False
    assert tuned_line(es) == "S = 7: the chosen cache"
    assert os.environ["RIDGEFILL_CACHE_DIR"] == str(tmp_path / "from-the-shell")  # the user's, untouched

    s.cache_location = ""  # empty: the variable the app was started with decides, in the child too
    es = s.engine_settings()
    assert es.cache_root is None
    es.warm_up = False
    assert tuned_line(es) == "S = 9: the from-the-shell cache"


def test_the_cache_location_moves_this_processs_cache_and_an_empty_one_gives_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(tmp_path / "from-the-shell"))
    s = Settings(cache_location=str(tmp_path / "chosen"))
    try:
        s.use_cache_location()
        assert user_paths.cache_dir() == tmp_path / "chosen" and user_paths.maps_dir() == tmp_path / "chosen" / "maps"
        assert s.hub_settings().maps_dir == tmp_path / "chosen" / "maps"
        s.cache_location = ""
        s.use_cache_location()
        assert user_paths.cache_dir() == tmp_path / "from-the-shell" == s.hub_settings().cache_root
    finally:
        user_paths.use_cache_root(None)


def test_the_hub_settings_fall_back_to_the_users_variables(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example")
    monkeypatch.setenv("HF_TOKEN", "from-the-shell")
    hub = Settings().hub_settings()
    assert (hub.endpoint, hub.token) == ("http://mirror.example", "from-the-shell")
    hub = Settings(hub_endpoint="http://chosen.example/", hub_token="typed-in").hub_settings()
    assert (hub.endpoint, hub.token) == ("http://chosen.example", "typed-in")
    monkeypatch.delenv("HF_ENDPOINT")
    monkeypatch.delenv("HF_TOKEN")
    hub = Settings().hub_settings()
    assert (hub.endpoint, hub.token) == (None, None)
