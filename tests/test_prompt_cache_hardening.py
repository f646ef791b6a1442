"""The prompt cache on disk against damaged entries, full disks and a second process on the same folder:
every bad entry is refused (never another exception), a failed save leaves nothing, and one process
never removes or clears away what another just wrote. Synthetic entries (tests/fuzz_cache.py), no model,
except for the idle work's save that fails while the live document stays."""
from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import backend.prompt_cache as pc
from backend.prompt_cache import HEADER, STATE, STREAMS, EntryKept, EntryRefused, PromptCache
from fuzz_cache import BUILD, KEY, check_loaded, save_synthetic, synthetic_facts, synthetic_state

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path) -> PromptCache:
    return PromptCache(tmp_path / "prompts")


def _load(cache, entry):
    return cache.load(entry, model_key=KEY, build=BUILD)


def _edit_header(folder: Path, change) -> None:
    h = json.loads((folder / HEADER).read_text())
    change(h)
    (folder / HEADER).write_text(json.dumps(h))


def test_a_synthetic_entry_loads_whole(cache):
    """The control for the tests below: a saved entry with split streams loads, and its parts fit."""
    entry = save_synthetic(cache, synthetic_facts(list(range(40)), n_clean=10))
    loaded = _load(cache, entry)
    check_loaded(loaded)
    assert loaded.state == synthetic_state(entry.header["record"]) and len(loaded.arrays["stream_rows"]) == 30


@pytest.mark.parametrize("damage", ["not safetensors", "a float flipped"])
def test_damaged_split_streams_are_refused_and_removed(cache, damage):
    entry = save_synthetic(cache, synthetic_facts(list(range(40)), n_clean=10))
    blob = bytearray((entry.folder / STREAMS).read_bytes())
    if damage == "not safetensors":
        blob[:8] = b"\xff" * 8  # the header length: safetensors raises SafetensorError
    else:
        blob[-1] ^= 0x40  # still valid safetensors: only the sha256 tells
    (entry.folder / STREAMS).write_bytes(bytes(blob))
    with pytest.raises(EntryRefused, match="split streams"):
        _load(cache, entry)
    assert not entry.folder.exists() and cache.entries() == []


def test_an_entry_evicted_by_another_process_while_it_loads_still_loads_or_is_refused(cache, monkeypatch):
    """The other process removes the folder after the files were read, before the last-use stamp."""
    entry = save_synthetic(cache, synthetic_facts(list(range(30))))
    other = PromptCache(cache.root)
    real = pc.read_layout

    def evicted_meanwhile(state):
        other.remove(entry)
        return real(state)

    monkeypatch.setattr(pc, "read_layout", evicted_meanwhile)
    loaded = _load(cache, entry)  # what was read is whole: used
    assert loaded.state == synthetic_state(entry.header["record"]) and not entry.folder.exists()
    monkeypatch.undo()
    with pytest.raises(EntryRefused, match="gone"):  # listed before, gone now
        _load(cache, entry)


MALFORMED = {
    "approximated run of strings": lambda h: h["record"].update(approximated=[[10, "40", 3]]),
    "tokens of floats": lambda h: h["record"].update(tokens=[float(t) for t in h["record"]["tokens"]]),
    "no n_clean": lambda h: h["record"].pop("n_clean"),
    "record a list": lambda h: h.update(record=[1, 2]),
    "n_tokens a string": lambda h: h.update(n_tokens="40"),
    "run over the end": lambda h: h["record"].update(approximated=[[10, 99, "speed:x"]]),
}


@pytest.mark.parametrize("bad", list(MALFORMED))
def test_a_malformed_header_is_not_listed_and_refused_if_loaded(cache, bad):
    entry = save_synthetic(cache, synthetic_facts(list(range(40)), n_clean=10))
    _edit_header(entry.folder, MALFORMED[bad])
    assert cache.entries() == []  # callers never see it
    with pytest.raises(EntryRefused, match="malformed"):  # listed before the edit
        _load(cache, entry)
    assert not entry.folder.exists()


def test_unreadable_folders_count_against_the_limit_and_are_evicted_first(tmp_path):
    cache = PromptCache(tmp_path / "prompts", limit_bytes=10**9)
    bad = save_synthetic(cache, synthetic_facts(list(range(40))))
    (bad.folder / HEADER).write_text("{not json")
    save_synthetic(cache, synthetic_facts(list(range(50))))
    (good,) = cache.entries()  # the bad one is not listed
    cache.limit_bytes = good.n_bytes + 10  # room for the good one only
    cache.evict()
    assert not bad.folder.exists() and good.folder.exists()


@pytest.mark.parametrize("code", [errno.EMFILE, errno.EACCES, errno.EIO])
def test_an_entry_unreadable_this_time_for_a_reason_outside_it_is_refused_and_kept(cache, monkeypatch, code):
    entry = save_synthetic(cache, synthetic_facts(list(range(40))))
    real_read = pc._read_file

    def failing(*args, **kw):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(pc, "_read_file", failing)  # the state: the load fails and tries to remove it
    with pytest.raises(EntryKept, match="it is kept"):
        _load(cache, entry)
    monkeypatch.setattr(pc, "_header_at", failing)  # now every header: listing, removing and evicting
    assert cache.entries() == [] and not cache.remove(entry)
    cache.limit_bytes = 0
    cache.evict()
    monkeypatch.undo()
    assert entry.folder.exists() and pc._read_file is real_read
    check_loaded(_load(cache, entry))  # the next time it reads, it loads


def test_a_state_whose_cell_count_is_huge_is_refused_before_any_allocation(cache):
    """read_layout sizes an array by the cell count: 2^32 - 1 cells would ask for 32 GB."""
    entry = save_synthetic(cache, synthetic_facts(list(range(20))))
    state = bytearray((entry.folder / STATE).read_bytes())
    state[12:16] = b"\xff\xff\xff\xff"
    (entry.folder / STATE).write_bytes(bytes(state))
    import hashlib

    _edit_header(entry.folder, lambda h: h.update(state_sha256=hashlib.sha256(state).hexdigest()))
    (listed,) = cache.entries()
    with pytest.raises(EntryRefused, match="cell count"):
        _load(cache, listed)


def test_a_fifo_in_an_entry_is_refused_without_waiting(cache):
    entry = save_synthetic(cache, synthetic_facts(list(range(20))))
    (entry.folder / STATE).unlink()
    os.mkfifo(entry.folder / STATE)
    outcome = []
    t = threading.Thread(target=lambda: outcome.append(_try_load(cache, entry)), daemon=True)
    t.start()
    t.join(10)
    assert outcome == ["refused"]


def _try_load(cache, entry) -> str:
    try:
        _load(cache, entry)
        return "loaded"
    except EntryRefused:
        return "refused"


def test_a_reader_refusing_a_replaced_entry_leaves_the_new_one(cache):
    """Another process replaces the entry for the same tokens between our listing and our load: the
    load is refused, and neither it nor a later remove takes the other process's fresh entry."""
    save_synthetic(cache, synthetic_facts(list(range(40))))
    (listed,) = cache.entries()
    other = PromptCache(cache.root)
    fresh = save_synthetic(other, synthetic_facts(list(range(40)), n_clean=20))
    assert fresh.folder == listed.folder
    with pytest.raises(EntryRefused):
        _load(cache, listed)
    assert not cache.remove(listed)
    (now,) = cache.entries()
    assert now.header == fresh.header
    check_loaded(_load(cache, now))


def test_clear_leaves_a_save_in_progress_and_removes_a_dead_writers_leftovers(cache, monkeypatch):
    monkeypatch.setattr(pc, "WRITE_CHUNK", 64)  # the state in pieces, so the other process clears between them
    other = PromptCache(cache.root)
    cache.root.mkdir(parents=True)
    dead = cache.root / ".0123456789ab-dead.1234abcd"
    dead.mkdir()
    os.utime(dead, (time.time() - 2 * pc.STALE_S,) * 2)
    calls = []

    def clear_meanwhile() -> bool:
        calls.append(other.clear() if len(calls) == 2 else None)
        return False

    entry = save_synthetic(cache, synthetic_facts(list(range(40))), cancel=clear_meanwhile)
    assert len(calls) > 2 and entry is not None and entry.folder.exists()
    assert not dead.exists()
    check_loaded(_load(cache, entry))


FULL_DISK = """
import resource, signal, sys
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from fuzz_cache import save_synthetic, synthetic_facts
import fuzz_cache
from backend.prompt_cache import PromptCache
fuzz_cache.WIDTH = 4096  # split streams far larger than the state
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
cache = PromptCache(Path(sys.argv[1]))
try:
    save_synthetic(cache, synthetic_facts(list(range(40)), n_clean=0))
except OSError as exc:
    print("OSError", exc)
except Exception as exc:
    print("other", type(exc).__name__, exc)
"""


def test_a_full_disk_while_writing_the_split_streams_is_an_oserror_and_leaves_nothing(tmp_path):
    """A real write failure (a file size limit, EFBIG), in a child process so the limit stays there."""
    root = tmp_path / "prompts"
    code = FULL_DISK.format(root=str(ROOT), tests=str(ROOT / "tests"))
    out = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("OSError"), out.stdout + out.stderr
    assert [p for p in root.iterdir()] == []


def test_the_idle_work_keeps_the_live_document_when_its_save_fails(tmp_path, monkeypatch):
    """Whatever a save raises (here safetensors' own error), the save is lost, not the K/V."""
    from safetensors import SafetensorError

    from backend.engine import Engine, EngineConfig
    from backend.idle_work import IdleWork
    from backend.embedded_models import embedded_model_path
    from backend.prompt_reuse import KEYS_FILE

    def fails(path, data, cancel):
        raise SafetensorError("Error while serializing: No space left on device")

    monkeypatch.setattr(pc, "_write_state", fails)
    with Engine(EngineConfig(str(embedded_model_path()), n_ctx=512, n_threads=2)) as engine:
        toks = [1] + [int(t) for t in np.random.default_rng(3).integers(300, 5000, 300)]
        engine.slot.prefill(toks, reuse_prefix=False)
        work = IdleWork(engine, PromptCache(tmp_path / "prompts"), refine=False)
        work.after_completion()
        assert work.step()
        assert engine.slot.tokens == toks and len(engine.slot.record) == len(toks)
        st = work.status()
        assert "could not be saved" in st.note and not st.saved and not work.pending \
            and [p.name for p in (tmp_path / "prompts").iterdir()] == [KEYS_FILE]  # nothing half-written


# ---- two real processes --------------------------------------------------------------------------
DOCS = [list(range(d * 100, d * 100 + 40 + d)) for d in range(6)]


def hammer(root: str, seconds: float, seed: int, start, results) -> None:
    """Save, load, clear and evict on `root` for `seconds`; report what it did and anything wrong."""
    import random

    rnd = random.Random(seed)
    cache = PromptCache(Path(root), limit_bytes=10**9)  # every document fits: only clear and the small evict remove
    log = {"saved": [], "wipes": [], "loaded": 0, "refused": [], "errors": []}
    start.wait(120)  # both at once
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        op = rnd.random()
        try:
            if op < 0.45:
                d = rnd.randrange(len(DOCS))
                facts = synthetic_facts(DOCS[d], n_clean=rnd.randrange(len(DOCS[d]) + 1))
                started = time.monotonic()
                entry = save_synthetic(cache, facts)
                log["saved"].append((d, started, entry.header))
            elif op < 0.95:
                listed = cache.entries(KEY)
                if listed:
                    loaded = _load(cache, rnd.choice(listed))
                    if loaded.state != synthetic_state(loaded.entry.header["record"]):
                        log["errors"].append("a state loaded with another entry's header")
                    check_loaded(loaded)
                    log["loaded"] += 1
            else:
                started = time.monotonic()
                cache.clear() if op < 0.975 else PromptCache(Path(root), limit_bytes=3000).evict()
                log["wipes"].append((started, time.monotonic()))
        except EntryRefused as exc:
            log["refused"].append(str(exc))
        except Exception as exc:  # noqa: BLE001 - reported to the test
            log["errors"].append(f"{type(exc).__name__}: {exc}")
    results.put(log)


def test_two_processes_saving_loading_clearing_and_evicting_on_one_folder(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results, start = ctx.Queue(), ctx.Barrier(2)
    procs = [ctx.Process(target=hammer, args=(str(tmp_path / "prompts"), 4.0, seed, start, results)) for seed in (1, 2)]
    for p in procs:
        p.start()
    logs = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
    assert all(not log["errors"] for log in logs), [log["errors"][:5] for log in logs]
    assert all(log["loaded"] > 10 and len(log["saved"]) > 10 for log in logs), logs  # they did overlap
    races = ("gone", "changed while it was read")
    assert all(any(r in why for r in races) for log in logs for why in log["refused"]), \
        [log["refused"][:5] for log in logs]  # refused only for another process's removal or replacement
    last_wipe = max([end for log in logs for _, end in log["wipes"]], default=0.0)
    cache = PromptCache(tmp_path / "prompts")
    held = {tuple(e.header["record"]["tokens"]): e for e in cache.entries()}
    for d, doc in enumerate(DOCS):
        saves = [(started, header) for log in logs for dd, started, header in log["saved"] if dd == d]
        if any(started > last_wipe for started, _ in saves):  # saved after every removal: it must be there
            assert tuple(doc) in held, f"document {d} was lost"
            assert held[tuple(doc)].header in [h for _, h in saves]
            check_loaded(_load(cache, held[tuple(doc)]))
    assert not [p for p in cache.root.iterdir() if p.name.startswith(".") and ".gone." in p.name]
