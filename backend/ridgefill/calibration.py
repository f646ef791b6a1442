"""Calibration: the calibration text (calibration_corpus) run once through the exact model, the
stream entering every layer 1..L-1 kept at a stride (stream_capture) and stored in the user cache
(activation_store), one part per sequence, so a map set for any split refits in seconds and a cancelled
capture resumes at its first missing part.
"""
from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from backend.disk import free_bytes
from backend.errors import RidgeFillError

from .activation_store import CACHE_VERSION, ActivationFolder, Activations, load_activations
from .calibration_corpus import CalibrationSequence, CalibrationTexts, calibration_sequences, calibration_texts, within_budget
from .capture_plan import CapturePlan, kept_rows, plan_parts
from .fingerprint import model_fingerprint, variant_key
from .map_store import activations_dir
from .stream_capture import capture_streams

log = logging.getLogger(__name__)

DEFAULT_STRIDE = 4  # neighbouring rows are highly correlated; ~7K rows suffice for d≈600
# Each text (and its chat copy) is cut to this many tokens: capture is the cost (an exact prefill
# reading every layer), and ~28 sequences of 1K tokens take minutes on a 2-core laptop.
MAX_SEQ_TOKENS = 1024
CAPTURE_CTX = 2048


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
    corpus = calibration_texts(texts)
    seqs = within_budget(calibration_sequences(engine, corpus.texts, min(engine.n_ctx - 8, seq_tokens)), max_tokens)
    layers = list(range(1, engine.info.n_layer))
    fp = model_fingerprint(engine.info.path)
    store = ActivationFolder(activations_dir() / variant_key(fp))
    store.forget_facts()
    parts = plan_parts(seqs, stride, layers, engine.info.n_embd)
    done = store.parts_present([p["file"] for p in parts])
    plan = CapturePlan.of(parts, done, layers, engine.info.n_embd, (disk_free or free_bytes)(store.folder), store.folder)
    if on_plan is not None:
        on_plan(plan)
    plan.check_disk()

    progress = {"cache_version": CACHE_VERSION, "fingerprint_key": variant_key(fp), "stride": stride,
                "layers": layers, "tokens": plan.tokens, "sequences": plan.sequences, "bytes_total": plan.bytes_total,
                "corpus_digest": corpus.digest, "plan": parts, "done": sorted(done), "seconds": store.earlier_seconds(done)}
    store.write_progress(progress)
    t0 = time.perf_counter()
    _capture_missing_parts(engine, store, seqs, progress, on_progress, cancel)
    run_s = time.perf_counter() - t0

    store.remove_parts_except({p["file"] for p in parts})
    facts = _facts(engine, progress, corpus, resumed=len(done), run_s=run_s, fingerprint=fp)
    store.write_facts(facts)
    log.info("captured %d rows from %d tokens (%d of %d sequences this run) in %.1f s into %s",
             facts["rows"], plan.tokens, plan.sequences - len(done), plan.sequences, run_s, store.folder)
    acts = load_activations(engine.info.path)
    if acts is None:
        raise RidgeFillError(f"the activations just captured in {store.folder} cannot be read back; capture again.")
    return acts


def _capture_missing_parts(engine, store: ActivationFolder, seqs: list[CalibrationSequence], progress: dict,
                           on_progress, cancel) -> None:
    """Capture and write each planned part not done yet, recording it in progress.json after each."""
    total, tokens_before = progress["tokens"], 0
    for part, seq in zip(progress["plan"], seqs):
        base = tokens_before
        tokens_before += len(seq.tokens)
        if part["file"] in progress["done"]:
            if on_progress is not None:
                on_progress("capture", tokens_before, total)
            continue
        t_part = time.perf_counter()
        tell = (lambda d, t, base=base: on_progress("capture", base + d, total)) if on_progress else None
        streams, keep = _capture_part(engine, seq.tokens, part["counter0"], progress["layers"], progress["stride"],
                                      tell, cancel)
        store.write_part(part["file"], streams, part["doc"], keep)
        progress["done"] = sorted({*progress["done"], part["file"]})
        progress["seconds"][part["file"]] = round(time.perf_counter() - t_part, 2)
        store.write_progress(progress)


def _capture_part(engine, tokens: list[int], counter0: int, layers: list[int], stride: int, on_progress, cancel):
    """The kept rows of one sequence (float32, each of `layers`) and their positions."""
    streams = capture_streams(engine, [tokens], layers, stride=stride, counter0=counter0, cancel=cancel,
                              dtype=np.float32, on_progress=on_progress)
    keep = kept_rows(len(tokens), counter0, stride)
    if streams[layers[0]].shape[0] != len(keep):
        raise RuntimeError(f"capture returned {streams[layers[0]].shape[0]} rows, expected {len(keep)}")
    return streams, keep


def _facts(engine, progress: dict, corpus: CalibrationTexts, resumed: int, run_s: float, fingerprint: dict) -> dict:
    """calibration.json: what was captured, how, and from which text."""
    plan = progress["plan"]
    return {
        "cache_version": CACHE_VERSION,
        "n_layer": engine.info.n_layer,
        "layers": progress["layers"],
        "tokens": progress["tokens"],
        "rows": int(sum(p["rows"] for p in plan)),
        "stride": progress["stride"],
        "sequences": len(plan),
        "prose_sequences": sum(1 for p in plan if p["kind"] == "prose"),
        "chat_sequences": sum(1 for p in plan if p["kind"] == "chat"),
        "documents": len({p["doc"] for p in plan}),
        "max_sequence_tokens": max(p["tokens"] for p in plan),
        "capture_seconds": round(sum(progress["seconds"].values()), 1),
        "resumed_sequences": resumed,  # parts kept from an earlier, unfinished run
        "captured_sequences": len(plan) - resumed,  # parts captured by the run that finished it
        "last_run_seconds": round(run_s, 1),
        "bytes": progress["bytes_total"],
        "threads": engine.config.n_threads,
        "corpus": corpus.source,
        "corpus_digest": corpus.digest,
        "parts": [p["file"] for p in plan],
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "fingerprint": fingerprint,
    }


def current_activations(model_path) -> Activations | None:
    """The cached activations of this model captured from today's calibration text, or None: a cache
    from an earlier corpus (the prose alone) is captured again."""
    return load_activations(model_path, calibration_texts().digest)


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
    """Cached activations of this model from today's calibration text, capturing them first (a few
    minutes; resumed where an unfinished capture stopped) when there are none."""
    acts = current_activations(model_path)
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
