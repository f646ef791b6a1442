"""User settings, kept as JSON in the user config dir (a file a person can read and fix by hand).

They reach the engine and the hub code as typed values (EngineSettings, HubSettings), never through the
environment: the variables a user starts the app with (HF_ENDPOINT, HF_TOKEN, RIDGEFILL_CACHE_DIR) stay
theirs, and an empty setting leaves them in charge.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from filelock import FileLock

from app.engine_protocol import EngineSettings
from backend import user_paths
from backend.hub.settings import HubSettings
from backend.json_file import read_object, write_private
from backend.private_files import private_dir
from backend.prompt_cache import DEFAULT_LIMIT_BYTES
from backend.protocol import AUTO_CTX, DEFAULT_MAX_TOKENS

FILE_NAME = "settings.json"
LOCK_TIMEOUT_S = 10  # another window's save takes milliseconds; past this the save fails as a disk error would


@dataclass
class Settings:
    threads: int = 0  # 0 = all cores
    n_ctx: int = AUTO_CTX  # 0: follows the document (backend/context_size.context_cap); else capped at the model's
    max_tokens: int = DEFAULT_MAX_TOKENS  # room kept for each answer, on a model with no Generation settings of its own
    model_path: str = ""  # "" = the embedded default model
    hub_endpoint: str = ""  # "" = huggingface_hub's default (or HF_ENDPOINT)
    hub_token: str = ""
    cache_location: str = ""  # "" = the platform's user cache dir
    ridgefill_on: bool = True
    split: int = 0  # 0 = the model's default split
    tail: int = 0  # 0 = the default exact tail
    compare_exact: bool = False
    generation: dict = field(default_factory=dict)  # model file name -> its Generation section (ui/generation_settings.py)
    prompt_cache_gb: int = DEFAULT_LIMIT_BYTES // 10**9  # the prompt cache on disk at most this size (0: none)
    first_start = False  # not a field (never saved): load() sets it where no settings file existed

    @classmethod
    def path(cls) -> Path:
        return user_paths.config_dir() / FILE_NAME

    @classmethod
    def load(cls) -> "Settings":
        """The saved settings; defaults for anything missing, unknown, of the wrong type or negative. A file
        that is not a JSON object is set aside as settings.json.bad-<time> (backend/json_file.py)."""
        s = cls()
        s.first_start = not cls.path().exists()  # the window opens on the models it recommends
        data = read_object(cls.path(), "the settings file") or {}
        for f in fields(cls):
            value = data.get(f.name)
            default = getattr(s, f.name)
            if value is not None and type(value) is type(default) and not (isinstance(value, int) and value < 0):
                setattr(s, f.name, value)
        s._base = asdict(s)
        return s

    def save(self) -> None:
        """Write what this object changed since it was loaded (or saved) over what the file holds now, under a
        lock: a token or a setting another window or `serve` saved meanwhile is kept. Mode 0600 (the hub
        token). An object made without load() writes all its values. OSError when it cannot be written."""
        mine = asdict(self)
        path = self.path()
        private_dir(path.parent)
        with FileLock(path.with_name(FILE_NAME + ".lock"), mode=0o600, timeout=LOCK_TIMEOUT_S):
            now = read_object(path, "the settings file") or {}
            write_private(path, json.dumps(_merged(now, mine, getattr(self, "_base", None)), indent=2))
        self._base = mine

    def engine_settings(self) -> EngineSettings:
        """How the engine child is built: the chosen model (else the embedded one), its threads and context,
        and the cache location (None: the child's environment or the platform's default)."""
        from backend.embedded_models import embedded_model_path

        return EngineSettings(model_path=self.model_path or str(embedded_model_path()), n_ctx=self.n_ctx,
                              n_threads=self.threads or None, cache_root=self.cache_location or None,
                              prompt_cache=self.prompt_cache_gb > 0, cache_limit_bytes=self.prompt_cache_bytes())

    def prompt_cache_bytes(self) -> int:
        return max(0, self.prompt_cache_gb) * 10**9

    def hub_settings(self) -> HubSettings:
        """Where the GUI's downloads and map requests go: these settings, else what the app was started
        with (HF_ENDPOINT, HF_TOKEN, RIDGEFILL_CACHE_DIR), else the defaults."""
        return HubSettings(cache_root=Path(self.cache_location) if self.cache_location else user_paths.cache_dir(),
                           endpoint=self.hub_endpoint or os.environ.get("HF_ENDPOINT") or None,
                           token=self.hub_token or os.environ.get("HF_TOKEN") or None)

    def use_cache_location(self) -> None:
        """This process's user cache follows the setting (the engine child's follows engine_settings())."""
        user_paths.use_cache_root(self.cache_location or None)


def _merged(on_disk: dict, mine: dict, base: dict | None) -> dict:
    """`on_disk` with the values `mine` changed since `base` (all of them when there is no base); a dict
    value (the Generation sections, one per model) is merged key by key the same way."""
    out = dict(on_disk)
    for key, value in mine.items():
        was = None if base is None else base.get(key)
        if not (isinstance(value, dict) and isinstance(was, dict) and isinstance(out.get(key), dict)):
            if base is None or value != was:
                out[key] = value
            continue
        inner = {k: v for k, v in out[key].items() if k in value or k not in was}  # drop only what I removed
        inner.update({k: v for k, v in value.items() if was.get(k) != v})
        out[key] = inner
    return out


@dataclass
class RunOverrides:
    """What the command line chose for this run only (`--model`, `--threads`, `--ctx`): applied over the
    saved settings wherever the engine is (re)built, never written into them. Opening another model in
    the window ends the model override. A `--ctx` of 0 (its default) leaves the saved context size."""

    model_path: str | None = None
    threads: int | None = None
    n_ctx: int | None = None

    def apply(self, engine: EngineSettings) -> EngineSettings:
        return replace(engine, model_path=self.model_path or engine.model_path,
                       n_threads=self.threads or engine.n_threads, n_ctx=self.n_ctx or engine.n_ctx)

