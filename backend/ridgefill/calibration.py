"""Calibration activations: the shipped prose corpus (and chat-formatted copies rendered with the
model's own template) run once through the exact model; the stream entering every layer 1..L-1 is
kept at a stride and stored in the user cache, so a map set for any split refits in seconds.

Cache folder: `<user cache>/activations/<fingerprint key>/`. Only safetensors and JSON are written and read.
- `parts/seq-<i>-<key>.safetensors`, one per calibration sequence (`h.<il>` float16 (rows, d) per layer,
  with `scale.<il>` when the rows were divided by a power of two to fit float16's range; `doc` and `pos`
  int32 per row), each written to a temporary name and renamed when whole;
- `progress.json`, the plan (sequences, tokens, stride, the bytes it needs) and the parts done so far,
  rewritten after every part: a cancelled or killed capture continues at the first missing part;
- `calibration.json`, written last (the fingerprint and the facts: tokens, rows, stride, sequences,
  capture time, corpus digest, the parts in order): only a folder with it counts as a cache.
A part's key hashes its tokens, its first row's counter, the stride and the layers, so a part is reused
only for the same rows of the same capture.

The first format (cache_version 1: one `streams.safetensors` with every row) is still read as it is;
nothing recaptures or rewrites it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from backend.corpus import corpus_files
from backend.documents import document_messages
from backend.disk import DISK_MARGIN, free_bytes
from backend.errors import RidgeFillError
from backend.protocol import ChatMessage, CompletionRequest

from .fingerprint import model_fingerprint, variant_key
from .map_store import activations_dir

log = logging.getLogger(__name__)

DEFAULT_STRIDE = 4  # neighbouring rows are highly correlated; ~7K rows suffice for d≈600
# Each text (and its chat copy) is cut to this many tokens: capture is the cost (an exact prefill
# reading every layer), and ~28 sequences of 1K tokens take minutes on a 2-core laptop.
MAX_SEQ_TOKENS = 1024
CAPTURE_CTX = 2048
STREAMS = "streams.safetensors"  # cache_version 1: every row in one file
FACTS = "calibration.json"
PROGRESS = "progress.json"
PARTS = "parts"
CACHE_VERSION = 2  # one safetensors part per sequence (resumable)
READABLE_VERSIONS = (1, 2)


class CaptureDiskShort(RidgeFillError):
    """The capture's activations would not fit the free disk space (checked before it starts)."""

    def __init__(self, needed: int, free: int, where: Path):
        self.needed, self.free, self.where = needed, free, where
        super().__init__(
            f"Not enough disk space to capture calibration activations: they need {_size(needed)} "
            f"in {where}, which has {_size(free)} free. Free some space, or move the cache "
            f"(RIDGEFILL_CACHE_DIR or the cache location in Settings), then try again; what was captured stays."
        )

# Questions for the chat copies: the app's use is "a document, then a question about it".
_QUESTIONS = (
    "Summarise this text in two sentences.",
    "What is the main subject of this document?",
    "List the key facts mentioned above.",
    "Who or what is this text about, and what happens?",
)


def _first_sentences(text: str, n: int) -> str:
    parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return " ".join(parts[1 : 1 + n]) or parts[0]  # skip a title-like first line


def calibration_sequences(engine, texts: list[str], max_seq: int) -> list[tuple[int, str, list[int]]]:
    """(document id, "prose"|"chat", tokens) for each text and its chat copy, each cut to max_seq."""
    seqs = []
    for i, text in enumerate(texts):
        prose = engine.tokenize(text)
        seqs.append((i, "prose", prose[:max_seq]))
        # The app's own document prompt (the text cut to leave room for the turns), plus a short
        # answer so assistant turns are seen too.
        room = max(16, max_seq - 160)
        doc = engine.detokenize(prose[:room]) if len(prose) > room else text
        messages = document_messages(doc, _QUESTIONS[i % len(_QUESTIONS)])
        messages.append(ChatMessage("assistant", _first_sentences(text, 2)[:300]))
        seqs.append((i, "chat", engine.prompt_tokens(CompletionRequest(messages=messages))[:max_seq]))
    return seqs


def corpus_digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass
class Activations:
    """Cached activations of one model: `layer(il)` loads the stream entering il as float32."""

    folder: Path
    n_layer: int
    facts: dict
    doc: torch.Tensor  # (rows,) document id per row (held-out rows are chosen by document)
    files: list[Path] = field(default_factory=list)  # the safetensors holding the rows, in row order

    def __post_init__(self) -> None:
        if not self.files:
            self.files = [self.folder / STREAMS]

    def layer(self, il: int) -> torch.Tensor:
        parts = []
        for path in self.files:
            with safe_open(str(path), framework="pt") as f:
                h = f.get_tensor(f"h.{il}").float()
                if f"scale.{il}" in f.keys():  # a part stored scaled down to fit float16
                    h *= f.get_tensor(f"scale.{il}").float()
                parts.append(h)
        return parts[0] if len(parts) == 1 else torch.cat(parts)


def cache_folder(model_path) -> Path:
    return activations_dir() / variant_key(model_fingerprint(model_path))


def _files_of(folder: Path, facts: dict) -> list[Path]:
    if facts.get("cache_version") == 1:
        return [folder / STREAMS]
    return [folder / PARTS / name for name in facts["parts"]]


def load_activations(model_path) -> Activations | None:
    """The cached activations of this exact model, or None (absent, unfinished, stale or unreadable)."""
    folder = cache_folder(model_path)
    try:
        facts = json.loads((folder / FACTS).read_text(encoding="utf-8"))
        if facts.get("cache_version") not in READABLE_VERSIONS or facts.get("fingerprint") != model_fingerprint(model_path):
            return None
        files = _files_of(folder, facts)
        docs = []
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                docs.append(f.get_tensor("doc"))
    except (OSError, ValueError, KeyError, json.JSONDecodeError, Exception):  # noqa: B014 - any damage means "capture again"
        return None
    return Activations(folder, int(facts["n_layer"]), facts, torch.cat(docs) if len(docs) > 1 else docs[0], files)


def capture_state(model_path) -> dict | None:
    """What an unfinished capture of this model left (progress.json: the plan and the parts done), or
    None when there is none (or it is complete)."""
    folder = cache_folder(model_path)
    if (folder / FACTS).is_file():
        return None
    try:
        return json.loads((folder / PROGRESS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@dataclass
class CapturePlan:
    """What a capture will do, known before it starts (shown to the user, checked against the disk)."""

    sequences: int
    tokens: int
    rows: int
    layers: int
    n_embd: int
    bytes_total: int  # every part (rows x layers x d x 2 bytes, plus doc/pos)
    done_sequences: int  # parts already on disk from an earlier, unfinished run
    bytes_left: int  # what the parts still to capture need
    disk_free: int
    folder: Path

    def summary(self) -> str:
        gb = _size
        text = (f"capture: {self.sequences} sequences, {self.tokens:,} tokens -> {self.rows:,} rows x "
                f"{self.layers} layers; needs {gb(self.bytes_total)} on disk")
        if self.done_sequences:
            text += (f"; resuming: {self.done_sequences} of {self.sequences} sequences already captured, "
                     f"{gb(self.bytes_left)} still to write")
        return text + f"; {gb(self.disk_free)} free"


def _size(b: int) -> str:
    return f"{b / 1e9:,.2f} GB" if b >= 1e9 else f"{b / 1e6:,.1f} MB"


def _part_key(tokens: list[int], counter0: int, stride: int, layers: list[int]) -> str:
    h = hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes())
    h.update(json.dumps([counter0, stride, layers, CACHE_VERSION]).encode())
    return h.hexdigest()[:12]


def _kept(n: int, counter0: int, stride: int) -> np.ndarray:
    return np.nonzero((counter0 + np.arange(n)) % stride == 0)[0]


def _half(x: np.ndarray, il: int) -> tuple[np.ndarray, float]:
    """float16 rows and the power-of-two scale they were divided by to fit its range: gemma3's residual
    stream holds values past float16's 65,504 in a few dimensions, which would become inf."""
    peak = float(np.abs(x).max()) if x.size else 0.0
    if not np.isfinite(peak):
        raise RidgeFillError(f"capture: the stream entering layer {il} holds inf or NaN; this model cannot be calibrated.")
    scale = float(2.0 ** np.ceil(np.log2(peak / 32768.0))) if peak > 32768.0 else 1.0
    return np.ascontiguousarray(x / scale if scale != 1.0 else x, dtype=np.float16), scale


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def capture_activations(
    engine,
    stride: int = DEFAULT_STRIDE,
    max_tokens: int | None = None,
    texts: list[str] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    seq_tokens: int = MAX_SEQ_TOKENS,
    on_plan: Callable[[CapturePlan], None] | None = None,
    disk_free: Callable[[Path], int] | None = None,
) -> Activations:
    """Run the calibration text through `engine` (exact) and store the activations in the user cache,
    one part per sequence: parts already on disk from an unfinished run of the same capture are kept.

    `max_tokens` caps the total (tests use a few hundred); `texts` replaces the shipped corpus;
    `seq_tokens` cuts each sequence (up to the engine's context). Before any decode the plan (sizes,
    parts done) goes to `on_plan` and the disk is checked (CaptureDiskShort when it is short).
    on_progress("capture", tokens done, tokens in all) counts the resumed parts as done.
    Raises Cancelled between chunks; the parts finished so far stay for the next run.
    """
    from .stream_capture import capture_streams

    model_path = engine.info.path
    files = corpus_files()
    if texts is None:
        texts = [p.read_text(encoding="utf-8") for p in files]
        digest = corpus_digest(files)
        source = [p.name for p in files]
    else:
        digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:16]
        source = ["(given texts)"]
    if not texts:
        raise ValueError("no calibration text")
    seqs = calibration_sequences(engine, texts, min(engine.n_ctx - 8, seq_tokens))
    if max_tokens is not None:  # alternate prose and chat copies until the budget is spent
        kept, left = [], max_tokens
        for d, kind, toks in seqs:
            if left <= 0:
                break
            kept.append((d, kind, toks[:left]))
            left -= len(kept[-1][2])
        seqs = kept
    seqs = [s for s in seqs if s[2]]

    n_layer, d_model = engine.info.n_layer, engine.info.n_embd
    layers = list(range(1, n_layer))
    total = sum(len(t) for _, _, t in seqs)
    fp = model_fingerprint(model_path)
    folder = activations_dir() / variant_key(fp)
    parts_dir = folder / PARTS
    (folder / FACTS).unlink(missing_ok=True)  # facts last: a half-written cache is never trusted

    # The plan: each sequence's part, its first row's counter and its kept rows.
    plan, counter = [], 0
    for i, (d, kind, toks) in enumerate(seqs):
        rows = len(_kept(len(toks), counter, stride))
        name = f"seq-{i:04d}-{_part_key(toks, counter, stride, layers)}.safetensors"
        plan.append({"index": i, "doc": d, "kind": kind, "tokens": len(toks), "counter0": counter, "rows": rows,
                     "file": name, "bytes": rows * (len(layers) * d_model * 2 + 8)})
        counter += len(toks)
    done = {p["file"] for p in plan if (parts_dir / p["file"]).is_file()}
    try:
        old = json.loads((folder / PROGRESS).read_text(encoding="utf-8"))
        seconds = {k: v for k, v in old.get("seconds", {}).items() if k in done}
    except (OSError, ValueError):
        seconds = {}
    bytes_total = sum(p["bytes"] for p in plan)
    bytes_left = sum(p["bytes"] for p in plan if p["file"] not in done)
    free = (disk_free or free_bytes)(folder)
    cp = CapturePlan(len(plan), total, sum(p["rows"] for p in plan), len(layers), d_model, bytes_total,
                     len(done), bytes_left, int(free), folder)
    if on_plan is not None:
        on_plan(cp)
    if bytes_left and free < bytes_left + DISK_MARGIN:
        raise CaptureDiskShort(bytes_left + DISK_MARGIN, int(free), folder)

    parts_dir.mkdir(parents=True, exist_ok=True)
    progress = {"cache_version": CACHE_VERSION, "fingerprint_key": variant_key(fp), "stride": stride,
                "layers": layers, "tokens": total, "sequences": len(plan), "bytes_total": bytes_total,
                "corpus_digest": digest, "plan": plan, "done": sorted(done), "seconds": seconds}
    _write_json_atomic(folder / PROGRESS, progress)
    resumed = len(done)
    tokens_before = 0
    t0 = time.perf_counter()
    for p, (_, _, toks) in zip(plan, seqs):
        base = tokens_before
        tokens_before += len(toks)
        if p["file"] in done:
            if on_progress is not None:
                on_progress("capture", tokens_before, total)
            continue
        t_part = time.perf_counter()
        streams = capture_streams(
            engine, [toks], layers, stride=stride, counter0=p["counter0"], cancel=cancel, dtype=np.float32,
            on_progress=(lambda d, t, base=base: on_progress("capture", base + d, total)) if on_progress else None,
        )
        keep = _kept(len(toks), p["counter0"], stride)
        if streams[layers[0]].shape[0] != len(keep):
            raise RuntimeError(f"capture returned {streams[layers[0]].shape[0]} rows, expected {len(keep)}")
        tensors = {}
        for il in layers:
            tensors[f"h.{il}"], scale = _half(streams[il], il)
            if scale != 1.0:
                tensors[f"scale.{il}"] = np.array([scale], np.float32)
        tensors["doc"] = np.full(len(keep), p["doc"], np.int32)
        tensors["pos"] = keep.astype(np.int32)
        tmp = parts_dir / f".{p['file']}.tmp"
        save_file(tensors, str(tmp))
        os.replace(tmp, parts_dir / p["file"])  # a part is there whole or not at all
        done.add(p["file"])
        progress["done"] = sorted(done)
        progress["seconds"][p["file"]] = round(time.perf_counter() - t_part, 2)
        _write_json_atomic(folder / PROGRESS, progress)
    run_s = time.perf_counter() - t0

    wanted = {p["file"] for p in plan}
    for stale in parts_dir.iterdir():  # parts of another plan (another budget or stride), temporary files
        if stale.name not in wanted:
            stale.unlink(missing_ok=True)
    facts = {
        "cache_version": CACHE_VERSION,
        "n_layer": n_layer,
        "layers": layers,
        "tokens": total,
        "rows": int(sum(p["rows"] for p in plan)),
        "stride": stride,
        "sequences": len(plan),
        "prose_sequences": sum(1 for p in plan if p["kind"] == "prose"),
        "chat_sequences": sum(1 for p in plan if p["kind"] == "chat"),
        "documents": len({p["doc"] for p in plan}),
        "max_sequence_tokens": max(p["tokens"] for p in plan),
        "capture_seconds": round(sum(progress["seconds"].values()), 1),
        "resumed_sequences": resumed,  # parts kept from an earlier, unfinished run
        "captured_sequences": len(plan) - resumed,  # parts captured by the run that finished it
        "last_run_seconds": round(run_s, 1),
        "bytes": bytes_total,
        "threads": engine.config.n_threads,
        "corpus": source,
        "corpus_digest": digest,
        "parts": [p["file"] for p in plan],
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fp,
    }
    _write_json_atomic(folder / FACTS, facts)
    log.info("captured %d rows from %d tokens (%d of %d sequences this run) in %.1f s into %s",
             facts["rows"], total, len(plan) - resumed, len(plan), run_s, folder)
    acts = load_activations(model_path)
    if acts is None:
        raise RidgeFillError(f"the activations just captured in {folder} cannot be read back; capture again.")
    return acts


def ensure_activations(
    model_path: str | os.PathLike,
    on_progress: Callable[[str, int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    engine=None,
    stride: int = DEFAULT_STRIDE,
    max_tokens: int | None = None,
    seq_tokens: int = MAX_SEQ_TOKENS,
    on_plan: Callable[[CapturePlan], None] | None = None,
    disk_free: Callable[[Path], int] | None = None,
    n_threads: int | None = None,
) -> Activations:
    """Cached activations of this model, capturing them first (a few minutes; resumed where an
    unfinished capture stopped) when there are none."""
    acts = load_activations(model_path)
    if acts is not None:
        return acts
    kw = dict(stride=stride, max_tokens=max_tokens, seq_tokens=seq_tokens, on_progress=on_progress, cancel=cancel,
              on_plan=on_plan, disk_free=disk_free)
    if engine is not None:
        return capture_activations(engine, **kw)
    from backend.engine import Engine, EngineConfig

    cfg = EngineConfig(str(model_path), n_ctx=max(CAPTURE_CTX, seq_tokens + 8))
    if n_threads:
        cfg.n_threads = n_threads
    eng = Engine(cfg)
    try:
        return capture_activations(eng, **kw)
    finally:
        eng.close()
