"""Calibration activations: the shipped prose corpus (and chat-formatted copies rendered with the
model's own template) run once through the exact model; the stream entering every layer 1..L-1 is
kept at a stride and stored in the user cache, so a map set for any split refits in seconds.

Cache folder: `<user cache>/activations/<fingerprint key>/` holding `streams.safetensors`
(`h.<il>` float16 (rows, d) per layer, `doc` and `pos` int32 per row) and `calibration.json`
(the fingerprint and the facts: tokens, rows, stride, sequences, capture time, corpus digest).
Only safetensors and JSON are written and read.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors import safe_open
from safetensors.numpy import save_file

from backend.corpus import corpus_files
from backend.documents import document_messages
from backend.protocol import ChatMessage, CompletionRequest

from .fingerprint import model_fingerprint, variant_key
from .map_store import activations_dir

log = logging.getLogger(__name__)

DEFAULT_STRIDE = 4  # neighbouring rows are highly correlated; ~7K rows suffice for d≈600
# Each text (and its chat copy) is cut to this many tokens: capture is the cost (an exact prefill
# reading every layer), and ~28 sequences of 1K tokens take minutes on a 2-core laptop.
MAX_SEQ_TOKENS = 1024
CAPTURE_CTX = 2048
STREAMS = "streams.safetensors"
FACTS = "calibration.json"
CACHE_VERSION = 1

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

    def layer(self, il: int) -> torch.Tensor:
        with safe_open(str(self.folder / STREAMS), framework="pt") as f:
            return f.get_tensor(f"h.{il}").float()


def cache_folder(model_path) -> Path:
    return activations_dir() / variant_key(model_fingerprint(model_path))


def load_activations(model_path) -> Activations | None:
    """The cached activations of this exact model, or None (absent, stale or unreadable)."""
    folder = cache_folder(model_path)
    try:
        facts = json.loads((folder / FACTS).read_text(encoding="utf-8"))
        if facts.get("cache_version") != CACHE_VERSION or facts.get("fingerprint") != model_fingerprint(model_path):
            return None
        with safe_open(str(folder / STREAMS), framework="pt") as f:
            doc = f.get_tensor("doc")
    except (OSError, ValueError, json.JSONDecodeError, Exception):  # noqa: B014 - any damage means "capture again"
        return None
    return Activations(folder, int(facts["n_layer"]), facts, doc)


def capture_activations(
    engine,
    stride: int = DEFAULT_STRIDE,
    max_tokens: int | None = None,
    texts: list[str] | None = None,
    on_progress: Callable[[str, int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    seq_tokens: int = MAX_SEQ_TOKENS,
) -> Activations:
    """Run the calibration text through `engine` (exact) and store the activations in the user cache.

    `max_tokens` caps the total (tests use a few hundred); `texts` replaces the shipped corpus;
    `seq_tokens` cuts each sequence (up to the engine's context).
    """
    from .capture import capture_streams

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

    n_layer = engine.info.n_layer
    layers = list(range(1, n_layer))
    total = sum(len(t) for _, _, t in seqs)
    t0 = time.perf_counter()
    streams = capture_streams(
        engine, [t for _, _, t in seqs], layers, stride=stride,
        on_progress=(lambda d, t: on_progress("capture", d, t)) if on_progress else None, cancel=cancel,
    )
    capture_s = time.perf_counter() - t0

    # capture_streams keeps rows where a running counter over all sequences is a multiple of stride.
    doc_of = np.concatenate([np.full(len(t), d, np.int32) for d, _, t in seqs])
    pos_of = np.concatenate([np.arange(len(t), dtype=np.int32) for _, _, t in seqs])
    keep = np.arange(total) % stride == 0
    doc, pos = doc_of[keep], pos_of[keep]
    if streams[layers[0]].shape[0] != len(doc):
        raise RuntimeError(f"capture returned {streams[layers[0]].shape[0]} rows, expected {len(doc)}")

    fp = model_fingerprint(model_path)
    folder = activations_dir() / variant_key(fp)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"h.{il}": np.ascontiguousarray(streams[il], dtype=np.float16) for il in layers}
    tensors["doc"], tensors["pos"] = doc, pos
    (folder / FACTS).unlink(missing_ok=True)  # facts last: a half-written cache is never trusted
    save_file(tensors, str(folder / STREAMS))
    facts = {
        "cache_version": CACHE_VERSION,
        "n_layer": n_layer,
        "layers": layers,
        "tokens": total,
        "rows": int(len(doc)),
        "stride": stride,
        "sequences": len(seqs),
        "prose_sequences": sum(1 for _, k, _ in seqs if k == "prose"),
        "chat_sequences": sum(1 for _, k, _ in seqs if k == "chat"),
        "documents": len({d for d, _, _ in seqs}),
        "max_sequence_tokens": max(len(t) for _, _, t in seqs),
        "capture_seconds": round(capture_s, 1),
        "threads": engine.config.n_threads,
        "corpus": source,
        "corpus_digest": digest,
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fp,
    }
    (folder / FACTS).write_text(json.dumps(facts, indent=1) + "\n", encoding="utf-8")
    log.info("captured %d rows from %d tokens in %.1f s into %s", len(doc), total, capture_s, folder)
    return Activations(folder, n_layer, facts, torch.from_numpy(doc))


def ensure_activations(
    model_path: str | os.PathLike,
    on_progress: Callable[[str, int, int], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    engine=None,
    stride: int = DEFAULT_STRIDE,
) -> Activations:
    """Cached activations of this model, capturing them first (a few minutes) when there are none."""
    acts = load_activations(model_path)
    if acts is not None:
        return acts
    if engine is not None:
        return capture_activations(engine, stride=stride, on_progress=on_progress, cancel=cancel)
    from backend.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(str(model_path), n_ctx=CAPTURE_CTX))
    try:
        return capture_activations(eng, stride=stride, on_progress=on_progress, cancel=cancel)
    finally:
        eng.close()
