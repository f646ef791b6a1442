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

from app.engine_protocol import EngineSettings
from backend import user_paths
from backend.hub.settings import HubSettings
from backend.config_lock import config_lock, lock_path
from backend.json_file import read_object, read_object_and_bytes, repair, tell, write_private
from backend.private_files import tighten
from backend.prompt_cache import DEFAULT_LIMIT_BYTES
from backend.protocol import AUTO_CTX, DEFAULT_MAX_TOKENS
from backend.sampling import MAX_BREAKERS, fits_float

FILE_NAME = "settings.json"
WHAT = "the settings file"


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
    # model file names whose tune the user cancelled: it no longer starts by itself for them (ui/maps_tasks.py)
    auto_tune_off: list = field(default_factory=list)
    first_start = False  # not a field (never saved): load() sets it where no settings file existed

    @classmethod
    def path(cls) -> Path:
        return user_paths.config_dir() / FILE_NAME

    @classmethod
    def load(cls) -> "Settings":
        """The saved settings; defaults for anything missing, of the wrong type or out of range (unknown keys
        are a newer version's: kept). A file that is not a JSON object is set aside as settings.json.bad-<time>;
        one with wrong values is kept so and rewritten without them; either way the user is told
        (backend/json_file.tell). The folder and file are made private if an earlier version left them open."""
        path = cls.path()
        tighten(path.parent, path, lock_path(path))
        first_start = not path.exists()  # the window opens on the models it recommends
        s, _, wrong = cls._from(read_object(path, WHAT) or {})
        if wrong:  # the file is mended by the next save, under the lock (it may be another window's to write)
            tell(f"{WHAT} {path} has wrong values for {', '.join(wrong[:10])}: their defaults are used, and the next "
                 f"save keeps the file as it is now as {FILE_NAME}.bad-<time>")
        s.first_start = first_start
        s._base = asdict(s)
        return s

    @classmethod
    def _from(cls, data: dict) -> tuple["Settings", dict, list[str]]:
        """Settings from `data` (each right value, else the default), `data` without its wrong values, and
        the wrong keys."""
        s, good, wrong = cls(), {}, []
        for key, value in data.items():
            default = getattr(s, key) if key in _FIELDS else _UNKNOWN
            right = _checked(key, value, default)
            if right is _WRONG or (right != value and key in _FIELDS):
                wrong.append(key)
            if right is not _WRONG:
                good[key] = right
                if key in _FIELDS:
                    setattr(s, key, right)
        return s, good, wrong

    def save(self) -> None:
        """Write what this object changed since it was loaded (or saved) over what the file holds now, under a
        lock: a token or a setting another window or `serve` saved meanwhile is kept. Mode 0600 (the hub
        token). An object made without load() writes all its values. A file holding wrong values is kept as
        settings.json.bad-<time> and written without them. OSError when it cannot be written."""
        mine = asdict(self)
        path = self.path()
        with config_lock(path):
            now, raw = read_object_and_bytes(path, WHAT)
            _, good, wrong = self._from(now or {})
            text = json.dumps(_merged(good, mine, getattr(self, "_base", None)), indent=2)
            if not (wrong and raw is not None):
                write_private(path, text)
            elif repair(path, raw, text, WHAT, "wrong values for " + ", ".join(wrong[:10])) is None:
                raise OSError(f"{path} holds wrong values and no copy of it could be kept: it was not overwritten")
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


_FIELDS = {f.name for f in fields(Settings)}
_WRONG, _UNKNOWN = object(), object()  # _checked's "not right", and the default of a key this version does not know
# the most each count may be (past it a file was damaged or mistyped); llama.cpp takes counts as int32
_MOST = {"threads": 4096, "prompt_cache_gb": 1_000_000}
INT32_MAX = 2**31 - 1


def _checked(key: str, value, default):
    """`value` as setting `key` (default `default`) takes it: cleaned (a Generation section without its wrong
    values), or _WRONG. An unknown key's value is kept while it can be written back (not nested too deep)."""
    if default is _UNKNOWN:
        try:
            json.dumps(value, indent=2)
            return value
        except (RecursionError, ValueError):
            return _WRONG
    if type(value) is not type(default):  # bool is not int here: `true` is no thread count
        return _WRONG
    if type(value) is int:
        return value if 0 <= value <= _MOST.get(key, INT32_MAX) else _WRONG
    if isinstance(value, str):
        return value if "\0" not in value else _WRONG  # a NUL in a path or a token is refused by the system
    if isinstance(value, dict):
        return _generation(value)
    if isinstance(value, list):  # whole or not at all (a list of names without NUL), so a wrong one is said
        return value if all(isinstance(v, str) and "\0" not in v for v in value) else _WRONG
    return value


def _generation(sections: dict) -> dict:
    """The Generation sections (model file name -> its values) with the values a section cannot hold left out:
    each a JSON number a float holds, a bool, a string or a list of strings (backend/sampling.from_dict checks
    their ranges where they are used)."""
    def fits(v) -> bool:
        if isinstance(v, (bool, str)) or v is None:
            return isinstance(v, bool) or v is None or "\0" not in v
        if isinstance(v, list):
            return len(v) <= MAX_BREAKERS and all(isinstance(b, str) and "\0" not in b for b in v)
        return fits_float(v)

    return {name: {k: v for k, v in section.items() if fits(v)} for name, section in sections.items()
            if isinstance(section, dict)}


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

