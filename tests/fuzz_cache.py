"""Fuzz one prompt cache entry (backend/prompt_cache.py): its header JSON, state.bin and
streams.safetensors mutated (bytes flipped, cut, inserted; JSON values of the wrong type; sizes and
sha256 made to agree, so the damage reaches the state's and the streams' parsers), then listed and
loaded. `load` must give a Loaded whose parts agree (RowRecord.from_saved takes them) or EntryRefused;
anything else is a crash.

Also the synthetic entries the cache tests build: llama.cpp's sequence-state layout (backend/seq_state.py)
with rows derived from the record, so a test can tell a state that belongs to its header from one that
does not, without a model.

Long run: `python -m tests.fuzz_cache 100000` prints inputs, crashes (by kind) and peak RSS.
"""
from __future__ import annotations

import hashlib
import json
import random
import resource
import shutil
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np

from backend.prompt_cache import HEADER, STATE, STREAMS, Build, Entry, EntryRefused, Loaded, PromptCache
from backend.row_record import RowRecord

MARK = b"RFTEST01"  # the build's leading bytes of a synthetic state
BUILD = Build("synthetic", MARK.hex())
KEY = "0123456789ab"
ROW_BYTES, N_LAYER, WIDTH = 16, 2, 4  # K and V row bytes, layers, split-stream width


def _rows(facts: dict, n: int) -> bytes:
    """Row bytes derived from the whole record: another record's state differs."""
    seed = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).digest()
    return (seed * (n * ROW_BYTES // len(seed) + 1))[: n * ROW_BYTES]


def synthetic_state(facts: dict) -> bytearray:
    """A state in seq_state's layout for `facts`' rows: one stream, cells in order, K and V rows per layer."""
    n = len(facts["tokens"])
    out = bytearray(MARK) + struct.pack("<II", 1, n)
    for p in range(n):
        out += struct.pack("<iIi", p, 1, 0)  # position, one sequence, sequence 0
    out += struct.pack("<II", 0, N_LAYER)
    rows = _rows(facts, n)
    for _kind in ("K", "V"):
        for _ in range(N_LAYER):
            out += struct.pack("<iQ", 1, ROW_BYTES) + rows
    return out


def synthetic_arrays(facts: dict) -> dict[str, np.ndarray]:
    """Split streams for the rows after the clean ones, derived from the record."""
    kept = np.arange(facts["n_clean"], len(facts["tokens"]), dtype=np.int64)
    if facts["stream_split"] is None or not len(kept):
        return {}
    seed = int.from_bytes(_rows(facts, 1)[:4], "little")
    return {"stream_rows": kept, "streams": np.random.default_rng(seed).random((len(kept), WIDTH), dtype=np.float32)}


def synthetic_facts(tokens: list[int], n_clean: int | None = None, tag: str = "speed:x", streams: bool = True) -> dict:
    """A row record: rows from `n_clean` on approximated (as `tag`), with split streams where asked."""
    n_clean = len(tokens) if n_clean is None else n_clean
    runs = [[n_clean, len(tokens), tag]] if n_clean < len(tokens) else []
    return {"tokens": list(tokens), "approximated": runs, "n_clean": n_clean,
            "stream_split": 3 if streams and runs else None}


def save_synthetic(cache: PromptCache, facts: dict, cancel=None) -> Entry | None:
    return cache.save(model_key=KEY, model_name="synthetic", build=BUILD, state=synthetic_state(facts),
                      facts=facts, arrays=synthetic_arrays(facts), cancel=cancel)


def check_loaded(loaded: Loaded) -> None:
    """What a caller does with a load (prompt_reuse.restore): the parts must fit each other."""
    record = loaded.entry.header["record"]
    cells = loaded.layout.cells_after_load()
    RowRecord.from_saved(record, loaded.arrays, cells if cells is not None else np.full(loaded.layout.n_rows, -1))


# ---- mutations -----------------------------------------------------------------------------------
def random_json(rnd: random.Random, depth: int = 0):
    kind = rnd.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.random() < 0.5
    if kind == 2:
        return rnd.choice([0, 1, -1, 2**31, 2**63, -(2**70), 10**400 // 10**380])
    if kind == 3:
        return rnd.choice([0.5, -0.0, 1e308, float("nan"), float("inf")])
    if kind == 4:
        return rnd.choice(["", "x", "speed:x", "\udcff", "0" * 64])
    if kind == 5:
        return rnd.randrange(0, 40)
    if kind == 6:
        return [random_json(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    if kind == 7:
        return {rnd.choice(["tokens", "approximated", "n_clean", "a"]): random_json(rnd, depth + 1)}
    return [rnd.randrange(0, 40), rnd.randrange(0, 40), "speed:x"]


def _paths(value, at=()):
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, at + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:50]):
            yield from _paths(v, at + (i,))


def mutate_json(header: dict, rnd: random.Random) -> dict:
    """One value somewhere in the header replaced by a random one, or deleted."""
    header = json.loads(json.dumps(header))
    paths = [p for p in _paths(header) if p]
    path = rnd.choice(paths)
    parent = header
    for k in path[:-1]:
        parent = parent[k]
    if rnd.random() < 0.2:
        del parent[path[-1]]
    else:
        parent[path[-1]] = random_json(rnd)
    return header


def mutate_bytes(data: bytes, rnd: random.Random) -> bytes:
    data = bytearray(data)
    for _ in range(rnd.randrange(1, 4)):
        how = rnd.randrange(5)
        at = rnd.randrange(len(data) + 1)
        if how == 0 and data:
            data[min(at, len(data) - 1)] ^= 1 << rnd.randrange(8)
        elif how == 1:
            del data[at:]
        elif how == 2:
            data[at:at] = rnd.randbytes(rnd.randrange(1, 9))
        elif how == 3 and data:
            data[min(at, len(data) - 1)] = rnd.choice([0, 0xFF, 0x7F, 0x80])
        else:
            data[at:at + 4] = struct.pack("<I", rnd.choice([0, 1, 2, 0xFFFFFFFF, 2**31, rnd.randrange(64)]))
    return bytes(data)


def mutate_entry(files: dict[str, bytes], rnd: random.Random) -> dict[str, bytes]:
    """The entry's files with one or two of them damaged; the header's sizes and sha256 sometimes made
    to match the damaged state or streams, so the parsers behind the sha256 check see the damage."""
    files, header = dict(files), json.loads(files[HEADER])
    for _ in range(rnd.randrange(1, 3)):
        target = rnd.choice([HEADER, HEADER, STATE, STATE, STREAMS])
        if target == HEADER:
            if rnd.random() < 0.7:
                header = mutate_json(header, rnd)
                files[HEADER] = json.dumps(header).encode()
            else:
                files[HEADER] = mutate_bytes(files[HEADER], rnd)
        elif target in files and rnd.random() < 0.9:
            files[target] = mutate_bytes(files[target], rnd)
            if rnd.random() < 0.6 and isinstance(header, dict):
                prefix = "state" if target == STATE else "streams"
                header[f"{prefix}_bytes"] = len(files[target])
                header[f"{prefix}_sha256"] = hashlib.sha256(files[target]).hexdigest()
                files[HEADER] = json.dumps(header).encode()
        else:
            files.pop(target, None)
    return files


# ---- one input -----------------------------------------------------------------------------------
def template(root: Path, rnd: random.Random) -> tuple[Entry, dict[str, bytes]]:
    """A valid entry's header and files (a few shapes: exact, approximated, with split streams)."""
    n = rnd.randrange(1, 24)
    facts = synthetic_facts([rnd.randrange(5000) for _ in range(n)], n_clean=rnd.randrange(n + 1),
                            streams=rnd.random() < 0.7)
    cache = PromptCache(root)
    entry = save_synthetic(cache, facts)
    files = {p.name: p.read_bytes() for p in entry.folder.iterdir()}
    cache.clear()
    return entry, files


def try_entry(root: Path, entry: Entry, files: dict[str, bytes]) -> str:
    """Write `files` as `entry`'s folder, list and load it: "loaded", "refused" or "absent"; anything
    else raises (a crash)."""
    shutil.rmtree(root, ignore_errors=True)
    entry.folder.mkdir(parents=True)
    for name, data in files.items():
        (entry.folder / name).write_bytes(data)
    cache = PromptCache(root)
    listed = cache.entries(KEY)
    outcome = "absent"
    for e in listed + [entry]:  # as listed now, and as listed before the damage
        try:
            loaded = cache.load(e, model_key=KEY, build=BUILD)
        except EntryRefused:
            outcome = "refused" if outcome == "absent" else outcome
            continue
        check_loaded(loaded)
        outcome = "loaded"
    return outcome


def fuzz_cache_entries(n: int, seed: int = 0, report_every: int = 0) -> dict:
    """`n` mutated entries listed and loaded; the figures (crashes by kind, with one example each)."""
    rnd = random.Random(seed)
    outcomes, crashes, examples = Counter(), Counter(), {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "prompts"
        templates = [template(root, rnd) for _ in range(16)]
        for i in range(n):
            entry, files = rnd.choice(templates)
            mutated = mutate_entry(files, rnd)
            try:
                outcomes[try_entry(root, entry, mutated)] += 1
            except Exception as exc:  # noqa: BLE001 - counted: the figure this run reports
                kind = f"{type(exc).__name__}: {str(exc)[:120]}"
                crashes[type(exc).__name__] += 1
                examples.setdefault(type(exc).__name__, (kind, {k: v[:300] for k, v in mutated.items()}))
            if report_every and (i + 1) % report_every == 0:
                print(f"{i + 1:,} inputs, {sum(crashes.values())} crashes, {time.perf_counter() - t0:.0f} s",
                      flush=True)
    return {"inputs": n, "outcomes": dict(outcomes), "crashes": dict(crashes), "examples": examples,
            "seconds": round(time.perf_counter() - t0, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


if __name__ == "__main__":
    figures = fuzz_cache_entries(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000, report_every=10_000)
    print(json.dumps({k: v for k, v in figures.items() if k != "examples"}, indent=1))
    for name, (kind, _files) in figures["examples"].items():
        print(f"example {name}: {kind}")
    sys.exit(1 if figures["crashes"] else 0)
