"""A request starts from the longest saved prefix of its prompt; the engine's sequence 0 is saved back.

Before a request's plan runs (backend/completion.py), `restore` loads into sequence 0 the entry of
backend/prompt_cache.py that this request may reuse most of (its rows exact, or approximated the way
this request's plan would write them: the row record's own rule), when it gives more than what the
engine holds already, and the plan's prefix reuse takes it from there (`cache_n` counts it). A refused entry is removed and the prompt prefilled as if there were none,
the reason in the timings note. `save_rows` writes sequence 0 and its row record back (on a
sliding-window model, only once every row is exact: see _windows_lost).

After a state load the cells are where llama.cpp put them: each row's cell is derived from the state's
cell order (seq_state.StateLayout.cells_after_load: on a sliding-window model, the global cache's, whose
layers the sources read), never taken from the saved record, and checked against that cache's first
layer's K rows in the live cache where RidgeFill will read cells.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from .engine import CancelCheck, Engine
from .errors import EngineError
from .row_record import RowRecord
from .private_files import private_dir, write_text_private
from .prompt_cache import Build, Entry, EntryKept, EntryRefused, PromptCache
from .seq_state import MARK_BYTES, read_layout

log = logging.getLogger(__name__)

MIN_SAVE_ROWS = 256  # shorter prompts prefill in well under a second: not worth an entry


def model_key(engine: Engine, cache: PromptCache | None = None) -> str:
    """The model's variant key (backend/ridgefill/fingerprint.py: identity and weights). Parsing the GGUF
    takes seconds, which a reopened document's first answer must not pay: the key is kept per file (path,
    size, mtime) in the cache folder's KEYS_FILE once found."""
    from .ridgefill.fingerprint import model_fingerprint, variant_key

    path = Path(engine.info.path).resolve()
    st = path.stat()
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    memo = cache.root / KEYS_FILE if cache is not None else None
    known = _read_keys(memo)
    if stamp not in known:
        known[stamp] = variant_key(model_fingerprint(path))
        if memo is not None:
            try:
                private_dir(memo.parent)
                tmp = memo.with_name(f"{memo.name}.{os.getpid()}")
                write_text_private(tmp, json.dumps(known))
                os.replace(tmp, memo)
            except OSError:
                pass  # only a memo
    return known[stamp]


KEYS_FILE = ".model-keys.json"  # hidden: not an entry


def _read_keys(memo: Path | None) -> dict:
    if memo is None:
        return {}
    try:
        data = json.loads(memo.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def build_of(engine: Engine, state: bytes) -> Build:
    return Build(engine.llama_cpp_version, read_layout(state).mark.hex())


def _saved_rows(entry: Entry) -> RowRecord:
    facts = entry.header["record"]
    return RowRecord.from_saved(facts, {}, np.full(len(facts["tokens"]), -1))


def _reuse_rank(rows: RowRecord, tokens: list[int], accept_tag: str | None) -> tuple[int, int]:
    """How good a record is for `tokens`: (exact rows it gives, rows it gives). Exact rows come first, so
    once a document is made exact every request on it gets exact rows, even where an older approximated
    entry matches a few more of its tokens (docs/measurements/prompt-cache.md#the-prompt-cache-prefers-exact-rows)."""
    n = rows.reusable_prefix(tokens, accept_tag)
    return n - len(rows.approximated(0, n)), n


def best_entry(engine: Engine, cache: PromptCache, tokens: list[int], accept_tag: str | None) -> tuple[Entry | None, int]:
    """The entry whose rows serve this request best (see _reuse_rank), and how many rows it gives, if it
    is better than what the engine holds."""
    best, rank = None, _reuse_rank(engine.slot.record, tokens, accept_tag)
    for entry in cache.entries(model_key(engine, cache)):
        if entry.header.get("n_tokens", 0) > engine.n_ctx:
            continue  # saved by an engine with a larger context: this one cannot hold it (it stays)
        try:
            here = _reuse_rank(_saved_rows(entry), tokens, accept_tag)
        except ValueError:  # listed entries have a record of the right shape; one whose parts disagree:
            here = (len(tokens), len(tokens))  # load() says why and removes it
        if here > rank:
            best, rank = entry, here
    return best, rank[1]


def restore(engine: Engine, cache: PromptCache, tokens: list[int], accept_tag: str | None) -> str:
    """Load the best entry for `tokens` into sequence 0; "" or the note saying why one was refused."""
    entry, given = best_entry(engine, cache, tokens, accept_tag)
    if entry is None:
        return ""
    if _window_rows_after(engine, entry, len(tokens) - given):
        return (f"prompt cache: the saved prompt's sliding-window cache holds its last window only, and the "
                f"{len(tokens) - given:,} new rows would be recorded in cells of the wrong cache; prefilled the "
                "prompt instead.")
    t0 = time.perf_counter()
    try:
        if _windows_lost(engine, entry.header.get("clean_rows") == entry.header.get("n_tokens")):  # an earlier version's
            raise EntryRefused("it holds approximated rows of a sliding-window model, whose windows it lacks")
        loaded = cache.load(entry, model_key=model_key(engine, cache), build=_build_here(engine))
        cells = loaded.layout.cells_after_load()
        rows = RowRecord.from_saved(entry.header["record"], loaded.arrays,
                                     cells if cells is not None else np.full(loaded.layout.n_rows, -1))
        engine.slot.load_state(loaded.state, rows)
        why = _cells_disagree(engine, loaded, cells, rows)
        if why:
            raise EntryRefused(why)
    except (EntryRefused, ValueError, EngineError) as exc:
        if not isinstance(exc, EntryKept):  # a kept entry failed before sequence 0 was touched: its rows still serve
            engine.slot.truncate(0)
            cache.remove(entry)
        log.warning("prompt cache entry %s refused: %s", entry.folder.name, exc)
        return f"prompt cache: {exc}; prefilled the prompt instead."
    log.info("prompt cache: loaded %s rows in %.0f ms", len(rows), (time.perf_counter() - t0) * 1000)
    return ""


def _window_rows_after(engine: Engine, entry, new_rows: int) -> bool:
    """Whether more than a window of rows would follow a saved sliding-window state: after such a load the
    global cache holds every row in cells 0..n-1 and the window cache its last window from cell 0, so new
    rows land in different cells in each, and rows past the exact tail (RidgeFill's late K/V, a document's
    sources) would use the wrong ones. A question's rows (within the tail) are safe."""
    window = engine.info.sliding_window
    return window > 0 and entry.header.get("n_tokens", 0) > window and new_rows > window


def held_back(engine: Engine) -> bool:
    """Whether sequence 0 is not saved as it is now, only once exact (a sliding-window model)."""
    return _windows_lost(engine, engine.slot.record.all_exact)


def _windows_lost(engine: Engine, exact: bool) -> bool:
    """Whether a saved state would miss what its approximated rows need: llama.cpp saves a sliding-window
    cache's last window only, and a row decoded again (guided, refinement) needs its own window. Such a
    prompt is saved once it is exact."""
    return not exact and engine.info.has_sliding_window


def _build_here(engine: Engine) -> Build:
    """This build's identity: its version and the mark its states begin with (read once per engine)."""
    slot = engine.slot
    if slot.state_mark is None:
        slot.state_mark = bytes(slot.state_bytes()[:MARK_BYTES]).hex()
    return Build(engine.llama_cpp_version, slot.state_mark)


def _cells_disagree(engine: Engine, loaded, cells, rows: RowRecord) -> str:
    """Why the derived cells are not where the state put the rows ("" when they are, or nothing reads
    them yet: rows all exact and RidgeFill not set up, or RidgeFill off for this model)."""
    if cells is None or (not rows.approximated() and engine.ridgefill is None):
        return ""  # nothing reads them yet (no approximated row to score or skip below the split)
    from .ridgefill.runtime import runtime

    rt = runtime(engine)
    if rt.layout is None:
        return ""
    state = loaded.layout
    i = state.full_section()
    il = _first_layer_of(rt, state, i)
    if il is None:
        return f"the state's {len(state.sections)} caches do not match the model's layers"
    live = rt.layout.layers[il].k_cache.rows().view(np.uint8)
    saved = state.k0_rows(loaded.state, i)
    if live.shape[1] != saved.shape[1] or not np.array_equal(live[cells[state.sections[i].positions]], saved):
        return "the row record's cells disagree with the state llama.cpp loaded"
    return ""


def _first_layer_of(rt, state, i: int) -> int | None:
    """The live layer whose K rows section `i` of the state begins with: llama.cpp writes one cache of
    every layer, or the global layers' cache and then the sliding-window layers' (llama_kv_cache_iswa)."""
    layers = sorted(rt.layout.layers)
    if len(state.sections) == 1:
        groups = [layers]
    else:
        groups = [list(rt.windows.global_layers), sorted(rt.windows.windowed)]
    if len(groups) != len(state.sections) or not groups[i] or len(groups[i]) != state.sections[i].n_layer:
        return None
    return groups[i][0]


def covers(new: dict, old: dict) -> bool:
    """Whether a record `new` gives every request at least what `old` gives: old's tokens lead new's,
    each of those rows is exact in new or approximated the same way, and new is clean at least as far."""
    n = len(old["tokens"])
    if new["tokens"][:n] != old["tokens"] or new["n_clean"] < old["n_clean"]:
        return False
    how_new, how_old = _hows(new, n), _hows(old, n)
    return all(a is None or a == b for a, b in zip(how_new, how_old))


def _hows(facts: dict, n: int) -> list[str | None]:
    how: list[str | None] = [None] * n
    for start, end, tag in facts["approximated"]:
        how[start:min(end, n)] = [tag] * max(0, min(end, n) - start)
    return how


def save_rows(engine: Engine, cache: PromptCache, cancel: CancelCheck | None = None) -> Entry | None:
    """Write sequence 0 and its row record as an entry (None: too short, already saved as it is, or
    stopped by `cancel`); entries it covers are removed. OSError when the disk is full (nothing is left)."""
    if len(engine.slot.record) < MIN_SAVE_ROWS or held_back(engine):
        return None
    facts, arrays = engine.slot.record.saved()
    key = model_key(engine, cache)
    older = cache.entries(key)
    for e in older:
        if e.header["record"] == facts:
            return None  # the same rows, the same way
    state = engine.slot.state_bytes()
    entry = cache.save(model_key=key, model_name=engine.info.name, build=build_of(engine, state), state=state,
                       facts=facts, arrays=arrays, cancel=cancel)
    if entry is not None:
        for e in older:
            if e.folder != entry.folder and covers(facts, e.header["record"]):
                cache.remove(e)
    return entry
