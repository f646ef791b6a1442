"""The file readers hold against hostile and damaged files (issue 39): the GGUF header walk, a download
whose header is damaged, settings, conversations and the user's model list of the wrong shape, and
publish-maps' manifest. Each test was red before its fix."""
from __future__ import annotations

import hashlib
import json
import logging
import struct
import threading
import tracemalloc
from pathlib import Path

import pytest

from lab.commands.fuzz_readers import (ARRAY, GGUF_TYPES, MANIFEST_TEMPLATE, gguf_bytes, gguf_string, model_kvs,
                                       nested_array, seed_ggufs, tensor_entry)
from backend.errors import ModelFileError
from backend.model_file import GGUFArray, read_model_header, read_model_info


def write(tmp_path, data: bytes, name: str = "m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


# --- GGUF --------------------------------------------------------------------------------------

def peak_while_refused(read, error, match: str | None = None) -> int:
    """The most bytes Python held while `read()` refused its input with `error`."""
    tracemalloc.start()
    try:
        with pytest.raises(error, match=match):
            read()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_string_longer_than_the_file_is_refused_before_any_copy(tmp_path):
    key = gguf_string(b"general.name", claimed=2**62)
    p = write(tmp_path, gguf_bytes(model_kvs(), tail=key + b"x" * 4_000_000, n_kv=6))
    read_model_header(write(tmp_path, gguf_bytes(model_kvs()), "warm.gguf"))  # imports are not the file's cost
    peak = peak_while_refused(lambda: read_model_header(p), ModelFileError, match="past the end of the file")
    assert peak < 1_000_000, f"{peak:,} bytes allocated for a 4 MB file: the rest of the file was copied"


def test_a_tensor_with_more_than_four_dimensions_is_refused(tmp_path):
    tensor = tensor_entry(b"t", [1, 1, 1, 1, 1], ggml_type=0, offset=0)
    data = gguf_bytes(model_kvs(), [tensor])
    p = write(tmp_path, data + b"\0" * (-len(data) % 32) + b"\0" * 64)
    with pytest.raises(ModelFileError, match="5 dimensions"):
        read_model_info(p)


def test_arrays_nested_deeply_are_refused_without_recursion(tmp_path):
    deep = write(tmp_path, gguf_bytes(model_kvs() + [(gguf_string(b"deep"), ARRAY, nested_array(5000))]), "deep.gguf")
    for read in (read_model_header, read_model_info):
        with pytest.raises(ModelFileError, match="nested more than"):
            read(deep)
    shallow = write(tmp_path, gguf_bytes(model_kvs() + [(gguf_string(b"shallow"), ARRAY, nested_array(3))]))
    assert read_model_header(shallow).n_layer == 4  # nesting a few deep is a valid file


@pytest.mark.parametrize("number", [("f32", float("nan")), ("f64", float("inf")), ("f32", -1.0)])
def test_a_count_that_is_nan_infinite_or_negative_is_refused(tmp_path, number):
    p = write(tmp_path, gguf_bytes(model_kvs(block_count=number)))
    for read in (read_model_header, read_model_info):
        with pytest.raises(ModelFileError, match="block_count"):
            read(p)


def test_a_nan_or_infinite_sampling_recommendation_is_dropped(tmp_path):
    odd = [(gguf_string(b"general.sampling.top_k"), GGUF_TYPES["f32"][0], struct.pack("<f", float("nan"))),
           (gguf_string(b"general.sampling.temp"), GGUF_TYPES["f32"][0], struct.pack("<f", float("inf"))),
           (gguf_string(b"general.sampling.top_p"), GGUF_TYPES["f32"][0], struct.pack("<f", 0.5))]
    p = write(tmp_path, gguf_bytes(model_kvs() + odd))
    assert read_model_header(p).sampling == (("top_p", 0.5),)


def test_an_old_gguf_version_says_which_versions_are_read(tmp_path):
    p = write(tmp_path, gguf_bytes(model_kvs(), version=1))
    with pytest.raises(ModelFileError, match="versions 2 and 3"):
        read_model_header(p)


def test_a_big_endian_file_still_reads_through_ggufs_reader(tmp_path):
    little, big, _ = seed_ggufs(tmp_path)
    a, b = read_model_header(write(tmp_path, little, "le.gguf")), read_model_header(write(tmp_path, big, "be.gguf"))
    assert (a.architecture, a.n_layer, a.n_embd, a.sampling) == (b.architecture, b.n_layer, b.n_embd, b.sampling)
    assert isinstance(read_model_info(tmp_path / "be.gguf"), type(a))
    assert GGUFArray(3).count == 3


# --- a download whose header is damaged --------------------------------------------------------

@pytest.fixture
def hub_settings(tmp_path, monkeypatch):
    from backend.hub.settings import HubSettings
    from tests.hub_server import FakeHub

    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    hub = FakeHub().start()
    yield hub, HubSettings(cache_root=tmp_path / "cache", endpoint=hub.url, token=None)
    hub.stop()


def download_of(hub, settings, data: bytes):
    from backend.hub.catalogue import ModelEntry
    from backend.hub.downloads import download_model

    hub.add_file("o/r", "m.gguf", data)
    entry = ModelEntry(id="o-m", name="m", architecture="", repo_id="o/r", filename="m.gguf",
                       size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    return lambda: download_model(entry, settings)


def left_on_disk(settings) -> list:
    return [p for root in (settings.staging_dir, settings.models_dir) if root.exists() for p in root.rglob("*")
            if p.is_file()]


def test_a_download_whose_header_is_nan_is_refused_and_deleted(hub_settings):
    from backend.hub.errors import VerificationFailed

    hub, settings = hub_settings
    run = download_of(hub, settings, gguf_bytes(model_kvs(block_count=("f32", float("nan")))))
    with pytest.raises(VerificationFailed, match="block_count.*deleted"):
        run()
    assert left_on_disk(settings) == []


def test_a_download_is_deleted_whatever_the_header_reader_raises(hub_settings, monkeypatch):
    from backend.hub.errors import VerificationFailed

    hub, settings = hub_settings

    def reader_bug(path):
        raise RecursionError("a reader bug")

    monkeypatch.setattr("backend.hub.downloads.read_model_info", reader_bug)
    with pytest.raises(VerificationFailed, match="a reader bug"):
        download_of(hub, settings, gguf_bytes(model_kvs()))()
    assert left_on_disk(settings) == []


# --- JSON files of the wrong shape ----------------------------------------------------------------

def set_aside_copies(path) -> list:
    return sorted(path.parent.glob(path.name + ".bad-*"))


@pytest.mark.parametrize("text", ["[]", "42", '"x"', "null", "{", "[" * 100_000 + "]" * 100_000])
def test_settings_of_the_wrong_shape_are_set_aside_and_defaults_used(text, caplog):
    from app.settings import Settings

    path = Settings.path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with caplog.at_level(logging.WARNING):
        assert Settings.load() == Settings()
    (kept,) = set_aside_copies(path)
    assert kept.read_text() == text and not path.exists()
    assert "kept as" in caplog.text and kept.name in caplog.text


def test_settings_with_a_token_are_private_and_two_writers_never_mix(tmp_path):
    from app.settings import Settings

    def saver(token: str) -> None:
        for _ in range(150):
            Settings(hub_token=token).save()

    threads = [threading.Thread(target=saver, args=(t,)) for t in ("a" * 2000, "b" * 2000)]
    for t in threads:
        t.start()
    seen = set()
    while any(t.is_alive() for t in threads):
        seen.add(Settings.load().hub_token[:1])
    for t in threads:
        t.join()
    assert seen <= {"a", "b", ""} and not set_aside_copies(Settings.path())  # never torn, never set aside
    assert Settings.path().stat().st_mode & 0o777 == 0o600
    assert not [p for p in Settings.path().parent.iterdir() if p.name.endswith(".tmp")]


def test_a_conversation_of_the_wrong_shape_is_set_aside_and_the_others_load(tmp_path):
    from app.conversations import Conversation, ConversationStore, Document, Message

    store = ConversationStore(tmp_path)
    good = Conversation(title="kept", document=Document("d", "text"), messages=[Message("user", "hi")])
    store.save(good)
    assert store.file_of(good.id).stat().st_mode & 0o777 == 0o600
    bad = {"list.json": "[]", "escape.json": json.dumps({**good.to_dict(), "id": "../outside"}),
           "message.json": json.dumps({**good.to_dict(), "id": "m1", "messages": [["user", "hi"]]})}
    for name, text in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError):
            store.load(name[:-5])
    assert [c.id for c in store.load_all()] == [good.id]
    for name, text in bad.items():
        (kept,) = set_aside_copies(tmp_path / name)
        assert kept.read_text() == text


def test_a_user_model_list_of_the_wrong_shape_is_set_aside(tmp_path):
    from backend.hub.catalogue import load_catalogue

    user = tmp_path / "user_models.json"
    builtin = load_catalogue(None)
    for text in ("[]", '{"models": 7}', "\xff"):
        user.write_bytes(text.encode("latin-1"))
        assert load_catalogue(user) == builtin
        (kept,) = set_aside_copies(user)
        assert kept.read_bytes() == text.encode("latin-1")
        kept.unlink()


def test_a_bad_user_entry_is_skipped_but_kept_when_another_is_added(tmp_path):
    from backend.hub.catalogue import add_hub, find_entry, load_catalogue

    user = tmp_path / "user_models.json"
    odd = [{"id": 5, "name": "n"}, {"id": "../up", "name": "n", "architecture": "", "filename": "f.gguf"},
           {"id": "ok-but", "name": "n", "architecture": "", "repo_id": None, "filename": "f.gguf", "size_bytes": "big"},
           {"id": "no-repo", "name": "n", "architecture": "", "filename": "f.gguf"}]  # found by the fuzzer
    user.write_text(json.dumps({"models": odd}))
    entries = load_catalogue(user)
    assert all(isinstance(e.id, str) and find_entry(e.id, entries) for e in entries)
    assert not {"../up", "ok-but", "no-repo"} & {e.id for e in entries}
    add_hub("o/r", "x.gguf", user)
    saved = json.loads(user.read_text())["models"]
    assert saved[:4] == odd and saved[4]["id"] == "o-x" and user.stat().st_mode & 0o777 == 0o600


# --- publish-maps ---------------------------------------------------------------------------------

def test_publish_maps_refuses_a_file_outside_the_folder_before_reading_or_uploading(tmp_path, hub_settings):
    from backend.hub.errors import HubError
    from backend.hub.maps_hub import publish_maps

    hub, settings = hub_settings
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"not yours")
    folder = tmp_path / "maps"
    folder.mkdir()
    manifest = {**MANIFEST_TEMPLATE, "files": {"../secret.safetensors": hashlib.sha256(b"not yours").hexdigest()}}
    (folder / "ridgefill.json").write_text(json.dumps(manifest))
    with pytest.raises(HubError, match="not a plain file name"):
        publish_maps(folder, "someone/x", settings)
    assert hub.requests == []  # nothing asked of the hub, nothing uploaded


def test_publish_maps_turns_a_manifest_the_reader_chokes_on_into_a_clear_error(tmp_path, hub_settings):
    from backend.hub.errors import HubError
    from backend.hub.maps_hub import publish_maps

    hub, settings = hub_settings
    folder = tmp_path / "maps"
    folder.mkdir()
    (folder / "ridgefill.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(HubError, match="cannot be published"):
        publish_maps(folder, "someone/x", settings)


# --- map_format.read_manifest: findings reported to its owner (not ours to edit) -------------------

def manifest_folder(tmp_path, manifest) -> object:
    (tmp_path / "ridgefill.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return tmp_path


KNOWN = {
    "nesting": "[" * 100_000 + "]" * 100_000,
    "mixed layers": {**MANIFEST_TEMPLATE, "layers": [3, [1]]},
    "float layers": {**MANIFEST_TEMPLATE, "layers": [3.0]},
}


@pytest.mark.parametrize("case", sorted(KNOWN))
def test_read_manifest_raises_only_its_documented_errors(tmp_path, case):
    from backend.ridgefill.map_format import FormatError, read_manifest

    try:
        read_manifest(manifest_folder(tmp_path, KNOWN[case]))
    except FormatError:
        pass


def test_read_manifest_memory_is_bounded_by_the_file(tmp_path):
    from backend.ridgefill.map_format import FormatError, read_manifest

    folder = manifest_folder(tmp_path, {**MANIFEST_TEMPLATE, "n_layer": 300_000})  # imported above: torch is not counted
    peak = peak_while_refused(lambda: read_manifest(folder), FormatError)
    assert peak < 5_000_000, f"{peak:,} bytes for a {len(json.dumps(MANIFEST_TEMPLATE))}-byte manifest"


def test_a_big_endian_file_with_an_array_count_past_the_end_is_refused_quickly(tmp_path):
    """gguf's own reader (still used for big-endian files) loops for ever on such a count, growing its
    lists: the header walk checks the file in its byte order first. Run in a child so a hang is a failure."""
    import subprocess
    import sys

    _, big, _ = seed_ggufs(tmp_path)
    at = big.index(b"tokenizer.ggml.scores") + len(b"tokenizer.ggml.scores")
    p = write(tmp_path, big[:at + 4] + struct.pack(">IQ", 0, 2**40) + big[at + 16:], "lying.gguf")
    code = ("import sys; from backend.model_file import read_model_header\n"
            "try: read_model_header(sys.argv[1])\nexcept Exception as e: print(type(e).__name__, e)")
    r = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=60,
                       cwd=Path(__file__).resolve().parents[1])
    assert r.stdout.startswith("ModelFileError lying.gguf is damaged") and "elements" in r.stdout, r.stdout + r.stderr
