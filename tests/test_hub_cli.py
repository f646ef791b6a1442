"""The hub commands in-process (fast): models, download, maps, download-maps, publish-maps."""
from __future__ import annotations

import json

import pytest

from app.cli import run_cli
from backend.embedded_models import embedded_model_path
from backend.ridgefill.defaults import MEASURED_SPLITS
from tests.hub_server import FakeHub
from tests.test_hub_downloads import write_tiny_gguf
from tests.test_hub_maps import make_map_folder

EMBEDDED = "smollm2-135m-instruct-q4_1"


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    return tmp_path / "home"


@pytest.fixture
def hub():
    h = FakeHub(token="tok").start()
    yield h
    h.stop()
# the embedded model's default split (SmolLM2: 30 layers, width 576); maps for it ship in maps_cache/
EMBEDDED_SPLIT = MEASURED_SPLITS[("llama", 30, 576)]


def test_models_lists_catalogue_with_states(capsys, monkeypatch):
    monkeypatch.setattr("backend.hub.recommend.os.cpu_count", lambda: 2)  # the offer is sized to the cores
    assert run_cli(["models", "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows[EMBEDDED]["state"] == "installed" and rows[EMBEDDED]["embedded"]
    assert rows["qwen3-0.6b-q8_0"]["state"] == "available" and rows["qwen3-0.6b-q8_0"]["fits_disk"] in (True, False)
    assert run_cli(["models", "--offline"]) == 0
    out = capsys.readouterr().out
    assert "not cached (offline)" in out and "installed (embedded)" in out
    assert "For documents on this machine: qwen2.5-0.5b-instruct-q4_k_m" in out  # 500 MB for two cores


def test_add_local_gguf_then_download_is_immediate(tmp_path, capsys):
    p = tmp_path / "my-model.gguf"
    write_tiny_gguf(p, n_floats=1000)
    assert run_cli(["models", "--add", str(p)]) == 0
    assert "added my-model" in capsys.readouterr().out
    assert run_cli(["download", "my-model", "--offline"]) == 0
    assert capsys.readouterr().out.strip() == str(p.resolve())
    assert run_cli(["download", EMBEDDED]) == 0
    assert capsys.readouterr().out.strip() == str(embedded_model_path())


def test_failures_exit_2_with_reason(capsys, hub):
    assert run_cli(["download", "no-such-model"]) == 2
    assert "not in the catalogue" in capsys.readouterr().err
    assert run_cli(["download", "qwen3-0.6b-q8_0", "--offline"]) == 2
    err = capsys.readouterr().err
    assert "Offline" in err and "not in the cache" in err
    assert run_cli(["download", "qwen3-0.6b-q8_0", "--endpoint", hub.url]) == 2
    err = capsys.readouterr().err
    assert "failed" in err and "not found on the hub" in err  # the state line and the reason
    assert run_cli(["download-maps", "qwen3-0.6b-q8_0"]) == 2
    assert "not installed" in capsys.readouterr().err


def test_publish_then_list_and_download_maps(tmp_path, capsys, hub):
    folder = make_map_folder(tmp_path / "s28", 28)
    repo = f"me/ridgefill-maps-{EMBEDDED}"
    assert run_cli(["publish-maps", str(folder), repo, "--endpoint", hub.url, "--token", "tok"]) == 0
    assert capsys.readouterr().out.strip().endswith(hub.repos[repo].commit)
    assert run_cli(["maps", EMBEDDED, "--endpoint", hub.url, "--maps-owner", "me"]) == 0
    out = capsys.readouterr().out
    assert "splits 28" in out and f"fit-maps --split {EMBEDDED_SPLIT}" in out
    assert run_cli(["download-maps", EMBEDDED, "--split", "28", "--endpoint", hub.url, "--maps-owner", "me"]) == 0
    cap = capsys.readouterr()
    assert cap.out.strip().endswith("-s28") and "maps smollm2-135m-instruct-q4_1: ready" in cap.err
    assert run_cli(["maps", EMBEDDED, "--offline"]) == 0
    assert "split 28: verified" in capsys.readouterr().out
    # Neither published nor shipped at split 20: the message leads to local fitting.
    assert run_cli(["download-maps", EMBEDDED, "--split", "20", "--endpoint", hub.url, "--maps-owner", "me"]) == 2
    err = capsys.readouterr().err  # SmolLM2 is not the model `python -m app` opens unasked: the hint names it
    assert f"python -m app --model {embedded_model_path()} fit-maps --split 20" in err


def test_shipped_maps_count_as_installed_offline(capsys):
    """The embedded model's maps ship in maps_cache/: listed, and 'downloaded' offline with no network."""
    assert run_cli(["maps", EMBEDDED, "--offline"]) == 0
    out = capsys.readouterr().out
    assert "split 18: verified" in out and "maps_cache" in out
    assert run_cli(["download-maps", EMBEDDED, "--offline"]) == 0  # the model's default split
    cap = capsys.readouterr()
    assert "maps_cache" in cap.out and cap.out.strip().endswith(f"-s{EMBEDDED_SPLIT:02d}") and ": ready" in cap.err


def test_add_hub_repo_lists_its_files_through_the_hub(capsys, hub):
    hub.add_file("org/one-GGUF", "one-Q4_K_M.gguf", b"GGUF" + bytes(100))
    hub.add_file("org/one-GGUF", "one-Q8_0.gguf", b"GGUF" + bytes(100))
    assert run_cli(["models", "--add", "org/one-GGUF", "--endpoint", hub.url]) == 0
    assert "org/one-GGUF/one-Q4_K_M.gguf" in capsys.readouterr().out  # several files: the Q4_K_M one
    assert run_cli(["models", "--add", "org/missing", "--endpoint", hub.url]) == 2
    assert "not found on the hub" in capsys.readouterr().err
