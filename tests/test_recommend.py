"""Which catalogue model the app offers for documents, by this machine's cores, memory and disk."""
from __future__ import annotations

from backend.hub.catalogue import ModelEntry, load_catalogue
from backend.hub.recommend import recommended_model

GB = 10**9


def _rows(entries, fits_disk=True):
    return [{"path": None, "fits_disk": fits_disk} for _ in entries]


def _pick(cores, ram=64 * GB, fits_disk=True):
    entries = load_catalogue()
    e = recommended_model(entries, _rows(entries, fits_disk), cores=cores, ram_bytes=ram)
    return e.id if e else None


def test_the_offer_grows_with_the_machine_and_is_an_instruct_model_with_a_long_context():
    assert _pick(2) == "qwen2.5-0.5b-instruct-q4_k_m"  # 500 MB for two cores
    assert _pick(8) == "llama-3.2-1b-instruct-q4_k_m"  # 2 GB: the largest instruct model under it
    assert _pick(16) == "gemma-3-4b-it-q4_k_m"
    assert _pick(64, ram=16 * GB) == "gemma-3-4b-it-q4_k_m"  # a quarter of 16 GB caps it below the 7B-12B files
    for cores in (2, 8, 16, 64):
        e = next(e for e in load_catalogue() if e.id == _pick(cores))
        assert not e.embedded and (e.context_length or 0) >= 32768


def test_nothing_is_offered_where_nothing_fits():
    assert _pick(1, ram=GB) is None  # a quarter of 1 GB holds no chat model of the catalogue at 250 MB a core
    assert _pick(16, fits_disk=False) is None


def test_a_pretrained_or_short_context_model_is_never_offered():
    base = ModelEntry(id="x", name="Some Model", architecture="llama", repo_id="o/r", filename="x.gguf",
                      size_bytes=100_000_000, context_length=32768)
    short = ModelEntry(id="y-instruct", name="Y Instruct", architecture="llama", repo_id="o/r", filename="y.gguf",
                       size_bytes=100_000_000, context_length=8192)
    assert recommended_model([base, short], _rows([base, short]), cores=4, ram_bytes=64 * GB) is None
