"""User settings, kept as JSON in the user config dir (a file a person can read and fix by hand)."""
from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from app.paths import config_dir

log = logging.getLogger(__name__)
FILE_NAME = "settings.json"
# What the environment said before any setting was applied: an emptied setting gives it back.
_STARTUP_ENVIRONMENT = {name: os.environ.get(name) for name in ("HF_ENDPOINT", "HF_TOKEN", "RIDGEFILL_CACHE_DIR")}


@dataclass
class Settings:
    threads: int = 0  # 0 = all cores
    n_ctx: int = 8192  # capped at the model's training context by the engine
    max_tokens: int = 256  # room kept for each answer, on a model with no Generation settings of its own
    model_path: str = ""  # "" = the embedded default model
    hub_endpoint: str = ""  # "" = huggingface_hub's default (or HF_ENDPOINT)
    hub_token: str = ""
    cache_location: str = ""  # "" = the platform's user cache dir
    ridgefill_on: bool = True
    split: int = 0  # 0 = the model's default split
    tail: int = 0  # 0 = the default exact tail
    compare_exact: bool = False
    generation: dict = field(default_factory=dict)  # model file name -> its Generation section (ui/generation_settings.py)

    @classmethod
    def path(cls) -> Path:
        return config_dir() / FILE_NAME

    @classmethod
    def load(cls) -> "Settings":
        """The saved settings; defaults for anything missing, unknown or of the wrong type."""
        s = cls()
        try:
            data = json.loads(cls.path().read_text(encoding="utf-8"))
        except FileNotFoundError:
            return s
        except (OSError, ValueError) as exc:
            log.warning("settings file unreadable (%s); using defaults", exc)
            return s
        for f in fields(cls):
            value = data.get(f.name)
            default = getattr(s, f.name)
            if value is not None and type(value) is type(default):
                setattr(s, f.name, value)
        return s

    def save(self) -> None:
        p = self.path()
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2), encoding="utf-8")
        os.replace(tmp, p)

    def apply_environment(self) -> None:
        """Hub endpoint/token and cache location reach the backend through the environment it reads. An
        empty setting gives back what the app was started with (a token from the shell stays), also after
        a non-empty one earlier in this session."""
        for name, value in (("HF_ENDPOINT", self.hub_endpoint), ("HF_TOKEN", self.hub_token),
                            ("RIDGEFILL_CACHE_DIR", self.cache_location)):
            value = value or _STARTUP_ENVIRONMENT.get(name)
            if value:
                os.environ[name] = value
            else:
                os.environ.pop(name, None)
