"""Questions that share a document: the document's rows prefilled once per mode and restored give each
question the answer a fresh prefill of its whole prompt gives (exact and guided), token for token."""
from __future__ import annotations

from dataclasses import replace

import pytest

from backend.completion import complete
from backend.documents import document_messages
from backend.protocol import CompletionRequest
from backend.recall.document_questions import questions_dir
from backend.recall.prefix_snapshot import PrefixSnapshots, shared_rows

QUESTIONS = ("Which program verifies signatures?", "Where are bugs reported?")


@pytest.fixture(scope="module")
def requests(small_engine):
    # about 1,500 tokens: a bulk of more than 1,024 rows in a 2K context
    document = (questions_dir() / "realqa-gnupg-readme-part1.txt").read_text(encoding="utf-8")
    return [CompletionRequest(messages=document_messages(document, q), max_tokens=12) for q in QUESTIONS]


@pytest.mark.parametrize("mode", ["off", "guided"])
def test_a_restored_document_prefill_answers_as_a_fresh_one(small_engine, requests, mode):
    asked = [replace(r, mode=mode) for r in requests]
    shared_n = shared_rows(small_engine, [small_engine.prompt_tokens(r) for r in asked], tail=64)
    assert shared_n >= 1024 and shared_n % small_engine.config.n_batch == 0
    snapshots = PrefixSnapshots(small_engine)
    for request in asked:
        fresh = complete(small_engine, replace(request, reuse_prefix=False))
        restored = snapshots.complete(request, shared_n)
        assert restored.tokens == fresh.tokens and restored.timings.mode == fresh.timings.mode == mode
        assert restored.timings.cache_n == shared_n and fresh.timings.cache_n == 0
        if mode == "guided":  # the question's own selection, from nothing: as many rows made exact
            assert restored.timings.exact_n == fresh.timings.exact_n > 0
    assert len(snapshots._saved) == 1  # the document prefilled once for both questions


def test_shared_rows_end_on_a_chunk_before_every_tail(small_engine):
    chunk = small_engine.config.n_batch
    a = list(range(3 * chunk + 100))
    b = a[: 2 * chunk + 10] + [7] * (chunk + 90)
    assert shared_rows(small_engine, [a, a], tail=64) == 3 * chunk  # the tail's 64 rows are never shared
    assert shared_rows(small_engine, [a, b], tail=64) == 2 * chunk
    assert shared_rows(small_engine, [a[:100], a], tail=64) == 0


@pytest.mark.parametrize("mode", ["off", "guided"])
def test_a_sliding_window_models_restored_prefill_answers_as_a_fresh_one(tmp_path, mode):
    """gemma3 (64-row windows): a saved sequence 0 keeps only its last window, so the rows a question adds
    landed in other cells in each cache and RidgeFill refused them. The whole context saved and loaded
    gives every row its own cell back: each question's answer is the fresh run's, token for token."""
    from backend.engine import Engine, EngineConfig
    from backend.ridgefill.plan import plan_ridgefill
    from test_quality_mode import Ident
    from tiny_gguf import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny-gemma3.gguf", "gemma3", n_layer=12)
    words = " ".join(f"w{i % 97}x{i % 13}" for i in range(260))
    asked = [CompletionRequest(prompt=f"{words}\n\nQuestion {q}: which?", max_tokens=8, mode=mode, split=7, tail=64)
             for q in ("one", "two and more")]
    with Engine(EngineConfig(str(path), n_ctx=4096, n_threads=2)) as e:
        prompts = [e.prompt_tokens(r) for r in asked]
        shared_n = shared_rows(e, prompts, tail=64)
        assert shared_n >= 1024 and e.info.has_sliding_window
        snapshots = PrefixSnapshots(e)
        for request, prompt in zip(asked, prompts):
            plan = plan_ridgefill(e, len(prompt), "guided", 7, 64, maps=Ident(7, 12)) if mode == "guided" else None
            fresh = complete(e, replace(request, reuse_prefix=False), plan=plan)
            restored = snapshots.complete(request, shared_n, plan=plan)
            assert restored.tokens == fresh.tokens and restored.timings.mode == fresh.timings.mode == mode, \
                restored.timings.note
            assert restored.timings.cache_n == shared_n
            if mode == "guided":
                assert restored.timings.exact_n == fresh.timings.exact_n > 0
