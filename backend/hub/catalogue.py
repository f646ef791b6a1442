"""The model catalogue: data in catalogue.json, plus what the user added (a local GGUF, any hub repo).

An entry names a GGUF file on the hub (repo id + file name) or on disk. Its `id` is the slug used
everywhere else: the folder in the user cache and the map set's hub repo name (see maps_hub.py).
"""
from __future__ import annotations

import json
import logging
import re
from dataclasses import MISSING, asdict, dataclass, fields
from importlib import resources
from pathlib import Path

from backend.config_lock import config_lock, lock_path
from backend.json_file import read_object, set_aside, tell, write_private
from backend.private_files import tighten

from .errors import HubError, UnknownModel, describe_error

log = logging.getLogger(__name__)

CATALOGUE_FILE = "catalogue.json"
USER_MODELS = "user_models.json"  # the user's additions (`models --add`, the GUI's "Open local"), in the data dir


def user_models_file() -> Path:
    from backend.user_paths import data_dir

    return data_dir() / USER_MODELS


@dataclass(frozen=True)
class ModelEntry:
    id: str
    name: str
    architecture: str
    repo_id: str | None
    filename: str
    quantization: str = ""
    size_bytes: int | None = None
    size_exact: bool = False
    sha256: str | None = None
    context_length: int | None = None
    licence: str = ""
    revision: str = "main"
    embedded: bool = False
    local_path: str | None = None  # a GGUF the user added from disk
    source: str = "catalogue"  # catalogue | user
    notes: str = ""

    @property
    def on_hub(self) -> bool:
        """Downloadable: an embedded model is too, for an app without its package (the bundle holds only the default)."""
        return self.repo_id is not None and self.local_path is None


def _read_builtin() -> dict:
    return json.loads(resources.files(__package__).joinpath(CATALOGUE_FILE).read_text(encoding="utf-8"))


def _entry(d: dict, source: str) -> ModelEntry:
    known = {f.name for f in fields(ModelEntry)} - {"source"}
    return ModelEntry(**{k: v for k, v in d.items() if k in known}, source=source)


def load_catalogue(user_file: Path | None = None) -> list[ModelEntry]:
    """Built-in entries first, then the user's (a user entry with a built-in id is ignored)."""
    entries = [_entry(d, "catalogue") for d in _read_builtin()["models"]]
    ids = {e.id for e in entries}
    for d in _read_user(user_file):
        if d.get("id") not in ids:
            entries.append(_entry(d, "user"))
            ids.add(d["id"])
    return entries


def find_entry(name: str, entries: list[ModelEntry]) -> ModelEntry:
    """By id, by `repo_id` (when one entry has it) or `repo_id:filename`, case-insensitively."""
    key = name.strip().lower()
    for e in entries:
        if e.id.lower() == key:
            return e
    repo, _, fname = key.partition(":")
    hits = [e for e in entries if e.repo_id and e.repo_id.lower() == repo and (not fname or e.filename.lower() == fname)]
    if len(hits) == 1:
        return hits[0]
    ids = ", ".join(e.id for e in entries)
    if len(hits) > 1:
        raise UnknownModel(f"'{name}' matches several files: {', '.join(h.filename for h in hits)}. Add ':<file>'.")
    raise UnknownModel(
        f"'{name}' is not in the catalogue. Known: {ids}. Add a hub repo with "
        "`python -m app models --add OWNER/REPO[:FILE.gguf]` or a local file with `--add PATH.gguf`."
    )


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")
    return s or "model"


def add_local(path: str | Path, user_file: Path) -> ModelEntry:
    """Add a GGUF file on disk (checked with the gguf package; nothing is copied)."""
    from backend.model_file import read_model_info

    info = read_model_info(path)  # raises ModelFileError with the reason for a bad file
    p = Path(info.path).resolve()
    entry = ModelEntry(
        id=slug(p.stem), name=info.name, architecture=info.architecture, repo_id=None, filename=p.name,
        size_bytes=info.size_bytes, size_exact=True, context_length=info.n_ctx_train, local_path=str(p),
        source="user", notes="added from disk",
    )
    _save_user(user_file, entry)
    return entry


def add_hub(repo_id: str, filename: str | None, user_file: Path, list_files=None) -> ModelEntry:
    """Add any hub repo. Without a file name, the repo's .gguf files are listed (`list_files(repo_id)`)
    and one is chosen: the only one, else a Q4_K_M, else the user must say which."""
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo_id):
        raise HubError(f"'{repo_id}' is not a hub repo id (expected OWNER/NAME).")
    if filename is None:
        if list_files is None:
            raise HubError(f"Name the GGUF file of {repo_id}: OWNER/NAME:FILE.gguf")
        try:
            ggufs = sorted(f for f in list_files(repo_id) if f.lower().endswith(".gguf"))
        except Exception as exc:  # not found, gated, unreachable: say which
            raise HubError(describe_error(exc, repo_id)) from exc
        if not ggufs:
            raise HubError(f"{repo_id} has no .gguf file; the app runs GGUF models only.")
        pick = ggufs if len(ggufs) == 1 else [f for f in ggufs if "q4_k_m" in f.lower()]
        if len(pick) != 1:
            raise HubError(f"{repo_id} has several GGUF files; choose one with {repo_id}:FILE. Files: {', '.join(ggufs)}")
        filename = pick[0]
    if not filename.lower().endswith(".gguf"):
        raise HubError(f"{filename} is not a .gguf file; the app runs GGUF models only.")
    stem = Path(filename).stem
    quant = re.search(r"(?i)(i?q\d[\w]*|f16|bf16|f32)$", stem)
    entry = ModelEntry(
        id=slug(f"{repo_id.split('/')[0]}-{stem}"), name=stem, architecture="", repo_id=repo_id, filename=filename,
        quantization=quant.group(1).upper() if quant else "", source="user", notes="added by repo id",
    )
    _save_user(user_file, entry)
    return entry


def _read_user(user_file: Path | None) -> list[dict]:
    """The user's entries that have a ModelEntry's shape; one that does not is skipped with a warning (and
    kept in the file: _save_user writes it back as it was)."""
    good, problems = [], []
    for d in read_user_items(user_file):
        problem = _entry_problem(d)
        if problem:
            problems.append(problem)
        else:
            good.append(d)
    if problems:  # the same notice each time the list is read: json_file.tell keeps it once
        tell(f"the user's model list {user_file}: {len(problems)} entries are skipped ({problems[0]}); "
             "fix or remove them in that file")
    return good


def read_user_items(user_file: Path | None) -> list:
    """Every item of the user file's "models" list. A file that is not {"models": [...]} is set aside as
    NAME.bad-<time> (a damaged user list must not hide the built-in catalogue, nor be overwritten)."""
    if user_file is None:
        return []
    tighten(Path(user_file).parent, user_file, lock_path(user_file))  # an earlier version wrote them 0644
    data = read_object(Path(user_file), "the user's model list")
    if data is None:
        return []
    if not isinstance(data.get("models", []), list):
        kept = set_aside(Path(user_file))
        tell(f"the user's model list {user_file}: 'models' is not a list; it was kept as {kept or user_file}")
        return []
    return data.get("models", [])


MAX_COUNT = 2**63 - 1  # a size in bytes or a context length; past it a number is no file's and no float's
_KINDS = {"str": (str,), "str | None": (str, type(None)), "int | None": (int, type(None)), "bool": (bool,)}
_TYPES = {f.name: _KINDS[f.type] for f in fields(ModelEntry)}  # the types a saved entry's fields may have


def _entry_problem(d) -> str:
    """Why `d` is not a user entry ("" when it is one): an object with a slug id and fields of the right types."""
    if not isinstance(d, dict) or not isinstance(d.get("id"), str) or slug(d["id"]) != d["id"]:
        return "no valid id"
    missing = [f.name for f in fields(ModelEntry) if f.default is MISSING and f.name not in d]
    if missing:
        return f"'{missing[0]}' is missing"
    bad = [k for k, v in d.items() if k in _TYPES and (isinstance(v, bool) and bool not in _TYPES[k]
                                                       or not isinstance(v, _TYPES[k]))]
    if bad:
        return f"'{bad[0]}' has the wrong type"
    odd = [k for k, v in d.items() if k in _TYPES and (type(v) is int and not 0 <= v <= MAX_COUNT
                                                       or isinstance(v, str) and "\0" in v)]
    return f"'{odd[0]}' is out of range" if odd else ""  # 10**400 bytes: no float holds it for the panel


def _save_user(user_file: Path, entry: ModelEntry) -> None:
    """Read, changed and written under the list's lock (two processes adding at once both keep theirs), whole
    under a unique temporary name."""
    with config_lock(user_file):
        models = [d for d in read_user_items(user_file) if not (isinstance(d, dict) and d.get("id") == entry.id)]
        write_private(Path(user_file), json.dumps({"models": models + [asdict(entry)]}, indent=2))
