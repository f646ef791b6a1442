"""The prompt cache on disk: a prefilled prompt saved with its row record and loaded by a new engine,
bad entries refused (the prompt prefilled as if there were none, the entry removed), atomic writes, LRU.

Real parts: the embedded SmolLM2 and llama.cpp's own state save/load; zero maps make approximated rows
obvious (a row record that lost them would show in the logits)."""
from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from backend.completion import complete
from backend.engine import Engine, EngineConfig
from backend.prompt_cache import HEADER, STATE, Build, PromptCache
from backend.prompt_reuse import model_key, restore, save_rows
from backend.protocol import CompletionRequest
from backend.ridgefill.plan import ridgefill_prefill
from test_quality_mode import SPLIT, ZeroMaps
from test_ridgefill_injection import induction_prompt, kl

TAIL = 64
N_DOC = 1150  # with the tail, just over MIN_BULK rows: the smallest prompt speed mode runs on


@pytest.fixture(scope="module")
def engines(model_path):
    """Two engines of one model: the one that saves, and a 'new process' that loads."""
    a = Engine(EngineConfig(model_path, n_ctx=2560, n_batch=512, n_ubatch=512))
    b = Engine(EngineConfig(model_path, n_ctx=2560, n_batch=512, n_ubatch=512))
    yield a, b
    a.close()
    b.close()


@pytest.fixture
def cache(tmp_path) -> PromptCache:
    return PromptCache(tmp_path / "prompts")


MAPS = ZeroMaps()  # one instance: its tag (which names it) is the same for the saver and the loader


def next_logits(engine, toks):
    """The last token decoded again after the rows before it: the next-token logits."""
    engine.slot.truncate(len(toks) - 1)
    engine.slot.decode(toks[-1:], len(toks) - 1, logits_last=True)
    return engine.last_logits()


@pytest.fixture(scope="module")
def saved(engines, tmp_path_factory):
    """A prompt prefilled in speed mode with zero maps by engine a and saved: (tokens, the approximation's
    tag, the saved folder, a's row record as saved, a's next-token logits)."""
    a, _ = engines
    toks = induction_prompt(a, N_DOC)
    rep = ridgefill_prefill(a, toks, "speed", SPLIT, TAIL, maps=MAPS)
    assert rep.mode == "speed" and rep.bulk_n > 0, rep.note
    facts, arrays = a.slot.record.saved()
    entry = save_rows(a, PromptCache(tmp_path_factory.mktemp("pristine")))
    assert entry is not None and entry.header["exact_rows"] == len(toks) - rep.bulk_n
    return toks, facts["approximated"][0][2], entry.folder, (facts, arrays), next_logits(a, toks)


def copy_of(saved, cache) -> Path:
    folder = cache.root / saved[2].name
    shutil.copytree(saved[2], folder)
    return folder


def _left(cache) -> list:
    """What the cache folder holds besides the per-model-file key record (prompt_reuse.KEYS_FILE)."""
    from backend.prompt_reuse import KEYS_FILE

    return [p for p in cache.root.iterdir() if p.name != KEYS_FILE]


def test_save_then_load_in_a_new_engine_gives_the_same_next_token_logits(engines, saved, cache):
    _, b = engines
    toks, tag, _, (facts_a, arrays_a), ref = saved
    copy_of(saved, cache)
    assert 0 < cache.entries()[0].header["exact_rows"] < len(toks)
    b.slot.truncate(0)
    assert restore(b, cache, toks, tag) == ""
    facts_b, arrays_b = b.slot.record.saved()
    assert facts_b == facts_a  # tokens, approximated runs, clean rows, split
    np.testing.assert_array_equal(arrays_b["streams"], arrays_a["streams"])
    assert b.slot.record.with_cells() == list(range(len(toks)))  # every cell re-derived from the state
    assert kl(ref, next_logits(b, toks)) < 1e-9
    b.slot.truncate(0)
    assert restore(b, cache, toks, None) == "" and len(b.slot.record) == 0  # exact requests reuse no approximated row
    restore(b, cache, toks, tag)
    assert save_rows(b, cache) is None  # the same rows, the same way: nothing new to write


def test_a_request_reuses_the_longest_saved_prefix_and_cache_n_counts_it(engines, cache):
    a, b = engines
    doc = a.detokenize(induction_prompt(a, 500)[1:])
    first = CompletionRequest(prompt=doc + "\n\nQ: who?", max_tokens=4)
    complete(a, first, prompt_cache=cache)
    assert save_rows(a, cache) is not None
    short = CompletionRequest(prompt=doc[: len(doc) // 2], max_tokens=1)  # a shorter prefix, saved too
    complete(a, short, prompt_cache=cache)
    save_rows(a, cache)
    b.slot.truncate(0)
    second = CompletionRequest(prompt=doc + "\n\nQ: where?", max_tokens=4)
    res = complete(b, second, prompt_cache=cache)
    n_doc = len(b.tokenize(doc))
    assert res.timings.note == "" and res.timings.cache_n >= n_doc - 2  # the whole document came from disk
    assert res.timings.prompt_n == res.prompt_tokens - res.timings.cache_n


def test_a_document_made_exact_wins_over_an_older_approximated_entry_that_matches_more(engines, cache):
    """The stale-entry case: an approximated entry of the document with one question matches a few more
    tokens of a new request than the exact entry of the same document with another question; the exact
    rows are loaded (the approximated entry would answer as the approximation did)."""
    a, b = engines
    toks = induction_prompt(a, N_DOC)
    asked, other = toks + a.tokenize(" Q: who is it", add_special=False), toks + a.tokenize(" R", add_special=False)
    a.slot.truncate(0)
    assert ridgefill_prefill(a, asked, "speed", SPLIT, TAIL, maps=MAPS).bulk_n > 0
    tag = a.slot.record.saved()[0]["approximated"][0][2]  # what a speed request with these maps accepts
    assert save_rows(a, cache) is not None
    a.slot.truncate(0)
    a.slot.prefill(other, reuse_prefix=False)
    assert save_rows(a, cache) is not None and len(cache.entries()) == 2
    again = asked[:-1] + a.tokenize(" where", add_special=False)  # the same question, its last word changed
    b.slot.truncate(0)
    assert restore(b, cache, again, tag) == ""
    assert len(b.slot) == len(other) and b.slot.record.all_exact


def _entry_folder(cache) -> Path:
    (entry,) = cache.entries()
    return entry.folder


def _edit_header(folder: Path, change) -> None:
    h = json.loads((folder / HEADER).read_text())
    change(h)
    (folder / HEADER).write_text(json.dumps(h))


def _cells_elsewhere(folder: Path, monkeypatch) -> None:
    """As if llama.cpp had put the loaded cells elsewhere than the state's cell order says: the derived
    cells are each one off."""
    from backend.seq_state import StateLayout

    derived = StateLayout.cells_after_load
    monkeypatch.setattr(StateLayout, "cells_after_load", lambda self: np.roll(derived(self), 1))


BAD_ENTRIES = {
    "truncated": (lambda f: (f / STATE).write_bytes((f / STATE).read_bytes()[:-1000]), "damaged"),
    "edited": (lambda f: (f / STATE).write_bytes(b"\0" * 64 + (f / STATE).read_bytes()[64:]), "damaged"),
    "another model": (lambda f: _edit_header(f, lambda h: h.update(model_key="0123456789ab")), "another model"),
    "another build": (lambda f: _edit_header(f, lambda h: h["build"].update(llama_cpp="0.0.1")), "another llama.cpp build"),
    "record disagrees": (lambda f: _edit_header(f, lambda h: h["record"].update(tokens=h["record"]["tokens"][:-5])),
                         "disagrees with the state"),
    "cells disagree": (_cells_elsewhere, "cells disagree"),
}


@pytest.mark.parametrize("bad", list(BAD_ENTRIES))
def test_a_bad_entry_is_refused_the_prompt_prefilled_and_the_entry_removed(engines, saved, cache, bad, monkeypatch):
    _, b = engines
    toks, tag = saved[0], saved[1]
    folder = copy_of(saved, cache)
    spoil, reason = BAD_ENTRIES[bad]
    spoil(folder, monkeypatch) if bad == "cells disagree" else spoil(folder)
    b.slot.truncate(0)
    note = restore(b, cache, toks, tag)
    assert reason in note and "prefilled the prompt instead" in note
    assert len(b.slot.record) == 0 and not folder.exists() and cache.entries() == []
    assert not _left(cache)  # nothing left, hidden or not


def test_an_entry_unreadable_this_time_is_prefilled_around_and_kept_for_the_next_request(engines, saved, cache,
                                                                                      monkeypatch):
    import backend.prompt_cache as pc

    _, b = engines
    toks, tag = saved[0], saved[1]
    folder = copy_of(saved, cache)
    b.slot.truncate(0)
    read_file = pc._read_file

    def too_many_open_files(files, name, limit):
        if name == STATE:  # the header reads: the entry is found, and its state fails
            raise OSError(errno.EMFILE, "Too many open files")
        return read_file(files, name, limit)

    with monkeypatch.context() as m:
        m.setattr(pc, "_read_file", too_many_open_files)
        note = restore(b, cache, toks, tag)
    assert "it is kept" in note and "prefilled the prompt instead" in note
    assert folder.exists() and len(cache.entries()) == 1
    b.slot.truncate(0)
    assert restore(b, cache, toks, tag) == "" and len(b.slot.record) == len(toks)


def test_an_entry_unreadable_this_time_leaves_the_rows_the_engine_holds(engines, saved, cache, monkeypatch):
    import backend.prompt_cache as pc

    _, b = engines
    toks, tag = saved[0], saved[1]
    copy_of(saved, cache)
    b.slot.truncate(0)
    assert restore(b, cache, toks, tag) == ""
    held = len(toks) // 2
    b.slot.truncate(held)  # the engine holds half the prompt: the saved entry would give more
    read_file = pc._read_file

    def io_error(files, name, limit):
        if name == STATE:
            raise OSError(errno.EIO, "Input/output error")
        return read_file(files, name, limit)

    with monkeypatch.context() as m:
        m.setattr(pc, "_read_file", io_error)
        assert "it is kept" in restore(b, cache, toks, tag)
    assert len(b.slot.record) == held and len(cache.entries()) == 1  # the question reuses them, not a prefill


def test_a_refused_entry_leaves_the_request_exact_and_its_reason_in_the_note(engines, cache, model_path):
    a, b = engines
    doc = a.detokenize(induction_prompt(a, 400)[1:])
    req = CompletionRequest(prompt=doc, max_tokens=3)
    want = complete(a, CompletionRequest(prompt=doc, max_tokens=3, reuse_prefix=False))
    save_rows(a, cache)
    folder = _entry_folder(cache)
    (folder / STATE).write_bytes((folder / STATE).read_bytes()[:100])
    b.slot.truncate(0)
    got = complete(b, req, prompt_cache=cache)
    assert "prompt cache: the saved state is damaged" in got.timings.note
    assert got.timings.cache_n == 0 and got.tokens == want.tokens


def test_a_full_disk_while_saving_leaves_no_half_written_entry(engines, cache, monkeypatch):
    import backend.prompt_cache as pc

    a, _ = engines
    a.slot.prefill(induction_prompt(a, 300), reuse_prefix=False)

    def half_then_full(path, state, cancel):
        with open(path, "wb") as f:
            f.write(bytes(state[: len(state) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pc, "_write_state", half_then_full)
    with pytest.raises(OSError):
        save_rows(a, cache)
    assert _left(cache) == []


def test_a_save_stopped_between_pieces_writes_nothing(engines, cache, monkeypatch):
    import backend.prompt_cache as pc

    a, _ = engines
    a.slot.prefill(induction_prompt(a, 300), reuse_prefix=False)
    monkeypatch.setattr(pc, "WRITE_CHUNK", 1 << 16)
    calls = iter(range(100))
    assert save_rows(a, cache, cancel=lambda: next(calls) >= 3) is None
    assert _left(cache) == []


def test_eviction_keeps_the_limit_least_recently_used_first(tmp_path):
    cache = PromptCache(tmp_path / "p", limit_bytes=3_500)  # about two entries of 1,000 state bytes and their header
    build = Build("test", "00")

    def save(tokens):
        facts = {"tokens": tokens, "approximated": [], "n_clean": len(tokens), "stream_split": None}
        return cache.save(model_key="k", model_name="m", build=build, state=bytearray(1000), facts=facts, arrays={})

    first, second = save([1, 2]), save([3, 4])
    os.utime(first.folder / HEADER, (1_000, 1_000))
    os.utime(second.folder / HEADER, (2_000, 2_000))  # the first is the least recently used
    third = save([5, 6])
    kept = {e.folder for e in cache.entries()}
    assert kept == {second.folder, third.folder} and cache.total_bytes() <= cache.limit_bytes
    assert save(list(range(10))).folder.exists()  # a new one always stays; older ones make room
    assert cache.total_bytes() <= cache.limit_bytes
    big = cache.save(model_key="k", model_name="m", build=build, state=bytearray(4000),
                     facts={"tokens": [9], "approximated": [], "n_clean": 1, "stream_split": None}, arrays={})
    assert big is None  # alone over the limit: not written


def test_cache_list_json_and_clear(engines, cache, capsys, monkeypatch):
    from app.cli import run_cli

    a, _ = engines
    a.slot.prefill(induction_prompt(a, 300), reuse_prefix=False)
    save_rows(a, cache)
    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(cache.root.parent))
    assert run_cli(["cache", "list", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (e,) = out["entries"]
    assert set(e) == {"files", "model", "tokens", "exact_rows", "bytes", "last_used"}
    assert e["tokens"] == len(a.slot.record) == e["exact_rows"] and all(Path(f).exists() for f in e["files"])
    assert e["bytes"] == sum(Path(f).stat().st_size for f in e["files"])
    assert run_cli(["cache", "clear"]) == 0
    assert cache.entries() == []


def test_the_model_key_is_the_variant_key_kept_per_model_file(engines, cache):
    from backend.prompt_reuse import KEYS_FILE
    from backend.ridgefill.fingerprint import model_fingerprint, variant_key

    a, _ = engines
    assert model_key(a) == model_key(a, cache) == variant_key(model_fingerprint(a.info.path))
    memo = cache.root / KEYS_FILE
    (stamp,) = json.loads(memo.read_text())
    memo.write_text(json.dumps({stamp: "kept"}))
    assert model_key(a, cache) == "kept"  # a reopened app does not parse the GGUF again
    assert cache.entries() == []  # the memo is no entry


def test_chat_saves_by_default_and_a_new_chat_reuses_it(tmp_path, capsys, monkeypatch):
    from app.cli import run_cli
    from backend.corpus import corpus_texts

    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(tmp_path))
    doc = tmp_path / "doc.txt"
    doc.write_text("\n\n".join(corpus_texts())[:2500], encoding="utf-8")
    ask = ["--ctx", "2048", "--threads", "2", "chat", "--doc", str(doc), "--json", "--max-tokens", "1", "--mode", "off"]

    def chat(question, *extra):
        assert run_cli(ask[:5] + [question] + ask[5:] + list(extra)) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert chat("Who?", "--no-cache")["document"]["saved"] is False and PromptCache().entries() == []
    first = chat("Who?")
    assert first["document"]["saved"] and first["timings"]["cache_n"] == 0
    second = chat("Where?")
    assert second["timings"]["cache_n"] > first["prompt_tokens"] // 2 and second["timings"]["note"] == ""


def test_a_sliding_window_model_saves_its_prompt_once_every_row_is_exact(tmp_path, monkeypatch):
    """llama.cpp saves a sliding-window cache's last window only, and a row decoded again needs its own:
    gemma3's approximated prompt is not saved, its refined one is and loads with the refined logits, and
    an approximated entry (as an earlier version wrote them) is refused with the reason."""
    import backend.prompt_reuse as reuse
    from backend.ridgefill.refine import Refinement
    from test_quality_mode import Zero
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(4).integers(3, 299, 1400)]
    cache = PromptCache(tmp_path / "prompts")
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as a, \
            Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as b:
        rep = ridgefill_prefill(a, toks, "speed", 7, TAIL, maps=Zero(7, 12))
        assert rep.mode == "speed" and rep.bulk_n > 0, rep.note
        assert save_rows(a, cache) is None and cache.entries() == []
        with monkeypatch.context() as m:
            m.setattr(reuse, "_windows_lost", lambda engine, exact: False)
            assert save_rows(a, cache) is not None
        tag = a.slot.record.saved()[0]["approximated"][0][2]
        note = restore(b, cache, toks, tag)
        assert "sliding-window" in note and "prefilled the prompt instead" in note
        assert len(b.slot.record) == 0 and cache.entries() == []
        Refinement(a).run()
        assert save_rows(a, cache) is not None
        ref = next_logits(a, toks)
        assert restore(b, cache, toks, None) == "" and len(b.slot.record) == len(toks)
        # rounding only: a's refined rows sit in other cells, so attention adds them in another order
        assert kl(ref, next_logits(b, toks)) < 1e-6


def test_an_approximated_sliding_window_prompt_is_not_called_saved(tmp_path):
    """`chat` without --refine on gemma3 writes nothing (saved once exact): the status says so, and why;
    refined, it is saved and says so."""
    from backend.idle_work import HELD_BACK_NOTE, IdleWork
    from test_quality_mode import Zero
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    toks = [1] + [int(t) for t in np.random.default_rng(5).integers(3, 299, 1400)]
    cache = PromptCache(tmp_path / "prompts")
    with Engine(EngineConfig(str(path), n_ctx=2048, n_threads=2)) as e:
        ridgefill_prefill(e, toks, "speed", 7, TAIL, maps=Zero(7, 12))
        work = IdleWork(e, cache, refine=False)
        work.after_completion()
        work.run()
        st = work.status()
        assert cache.entries() == [] and not st.saved and HELD_BACK_NOTE in st.note
        work = IdleWork(e, cache)
        work.after_completion()
        work.run()
        st = work.status()
        assert len(cache.entries()) == 1 and st.saved and st.note == "" and st.exact_rows == len(toks)
