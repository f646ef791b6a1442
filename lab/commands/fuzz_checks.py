"""What each reader fuzzed by `fuzz-readers` (lab/commands/fuzz_readers.py) may answer: each check writes an
input where its reader looks, reads it, and asserts a clean result or the reader's documented refusal."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

# the model a tuned record is read for (backend/ridgefill/tuned.model_key's facts)
TUNED_MODEL = SimpleNamespace(architecture="llama", name="m", n_layer=30, n_embd=8, n_head=1, n_head_kv=1,
                              file_type=1, size_bytes=5)


def as_bytes(data) -> bytes:
    return data if isinstance(data, bytes) else data.encode("utf-8")


def check_gguf(data: bytes, work: Path) -> str:
    """read_model_header and read_model_info: a ModelInfo of sane numbers, or ModelFileError naming the file."""
    from backend.errors import ModelFileError
    from backend.model_file import read_model_header, read_model_info

    path, outcomes = work / "model.gguf", []
    path.write_bytes(data)
    for read in (read_model_header, read_model_info):
        try:
            info = read(path)
        except ModelFileError as exc:
            assert path.name in str(exc) or "GGUF" in str(exc), f"an error that does not name the file: {exc}"
            outcomes.append("refused")
            continue
        counts = (info.n_layer, info.n_embd, info.n_head, info.n_head_kv, info.n_ctx_train, info.head_dim)
        assert all(isinstance(n, int) and n >= 0 for n in counts), counts
        outcomes.append("ok")
    return "/".join(outcomes)


def check_manifest(data, work: Path) -> str:
    """read_manifest: a dict, FormatError or FileNotFoundError; check_publishable: HubError (no files here)."""
    from backend.hub.errors import HubError
    from backend.hub.maps_hub import check_publishable
    from backend.ridgefill.map_format import MANIFEST, FormatError, read_manifest

    folder = work / "maps"
    folder.mkdir(exist_ok=True)
    (folder / MANIFEST).write_bytes(as_bytes(data))
    try:
        read_manifest(folder)
        outcome = "ok"
    except (FormatError, FileNotFoundError):
        outcome = "refused"
    try:
        check_publishable(folder)
        raise AssertionError("a manifest whose files are absent was taken for publishing")
    except HubError:
        pass
    return outcome


def check_settings(data, work: Path) -> str:
    """Settings.load: typed settings (defaults for the rest); a file that is not an object set aside whole."""
    from dataclasses import fields

    from app.settings import Settings

    path = work / "settings.json"
    path.write_bytes(as_bytes(data))

    class At(Settings):
        @classmethod
        def path(cls) -> Path:
            return path

    s, default = At.load(), At()
    assert all(type(getattr(s, f.name)) is type(getattr(default, f.name)) for f in fields(Settings)), s
    outcome = _kept_or_set_aside(path, data)
    s.save()
    assert _json(At.load()) == _json(s) and path.stat().st_mode & 0o077 == 0  # NaN != NaN: compare as JSON
    return outcome


def check_conversation(data, work: Path) -> str:
    """load: a Conversation, ValueError or OSError; load_all: the good ones (a bad file set aside whole)."""
    from app.conversations import ConversationStore

    store = ConversationStore(work)
    path = work / "abc123.json"
    path.write_bytes(as_bytes(data))
    try:
        store.load("abc123")
    except (ValueError, OSError):
        pass
    convs = store.load_all()
    outcome = _kept_or_set_aside(path, data)
    for c in convs:
        store.save(c)
        assert _json(store.load(c.id)) == _json(c) and store.file_of(c.id).stat().st_mode & 0o077 == 0
    return outcome


def check_catalogue(data, work: Path) -> str:
    """load_catalogue: built-ins plus the user's good entries; adding one keeps every item the file held."""
    from backend.hub.catalogue import read_user_items, add_hub, find_entry, load_catalogue

    path = work / "user_models.json"
    path.write_bytes(as_bytes(data))
    entries = load_catalogue(path)
    for e in entries:
        assert find_entry(e.id, entries).id == e.id
    outcome = _kept_or_set_aside(path, data)
    before = [d for d in read_user_items(path) if not (isinstance(d, dict) and d.get("id") == "o-x")]
    add_hub("o/r", "x.gguf", path)
    assert json.dumps(read_user_items(path)[:-1]) == json.dumps(before) and find_entry("o-x", load_catalogue(path))
    return outcome


def _json(obj) -> str:
    from dataclasses import asdict

    return json.dumps(asdict(obj), sort_keys=True)


def _kept_or_set_aside(path: Path, data) -> str:
    """'kept' when the file is still there, 'set aside' when it moved whole to NAME.bad-<time>."""
    aside = list(path.parent.glob(path.name + ".bad-*"))
    if path.exists():
        assert not aside, "a file both kept and set aside"
        return "kept"
    assert len(aside) == 1 and aside[0].read_bytes() == as_bytes(data), "a set-aside file lost its bytes"
    return "set aside"


def check_tuned(data, work: Path) -> str:
    """read_tuned: a record whose split is a layer count of this model, or None; its panel line a string."""
    from backend.ridgefill.tuned import read_tuned, summary, tuned_path

    path = tuned_path(TUNED_MODEL, work)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(as_bytes(data))
    rec = read_tuned(TUNED_MODEL, work)
    assert rec is None or (type(rec["split"]) is int and 1 <= rec["split"] <= TUNED_MODEL.n_layer - 2), rec
    assert isinstance(summary(rec), str)
    return "refused" if rec is None else "ok"


def check_installed(data, work: Path) -> str:
    """read_record: None, or a record naming a file inside its folder, with a size in bytes."""
    from backend.hub.store import RECORD, read_record

    (work / RECORD).write_bytes(as_bytes(data))
    rec = read_record(work)
    assert rec is None or ((work / rec["filename"]).parent == work and type(rec["size_bytes"]) is int), rec
    return "refused" if rec is None else "ok"


CHECKS = {"gguf": check_gguf, "manifest": check_manifest, "settings": check_settings,
          "conversation": check_conversation, "catalogue": check_catalogue, "tuned": check_tuned,
          "installed": check_installed}
