"""The engine's idle work: a prompt answered is saved, made exact and saved again; a new task preempts
it between pieces; a prefill cancelled midway saves nothing. In the engine child, as the GUI and the
server run it."""
from __future__ import annotations

import pytest

import time

from backend.corpus import corpus_texts
from backend.idle_work import IdleWork
from backend.prompt_cache import PromptCache
from backend.ridgefill.plan import ridgefill_prefill
from test_quality_mode import SPLIT, ZeroMaps
from test_ridgefill_injection import engine, induction_prompt  # noqa: F401 - the module's engine fixture


def test_idle_work_saves_then_refines_then_saves_the_exact_rows(engine, tmp_path):
    toks = induction_prompt(engine, 1200)
    ridgefill_prefill(engine, toks, "speed", SPLIT, 64, maps=ZeroMaps())
    cache = PromptCache(tmp_path / "prompts")
    work = IdleWork(engine, cache)
    assert not work.pending  # nothing was answered yet
    work.after_completion()
    assert work.step()  # first: saved as it is
    (entry,) = cache.entries()
    assert entry.header["exact_rows"] < len(toks) and work.status().saved
    shares = []
    while work.step():
        shares.append(work.status().exact_rows)
    assert shares == sorted(shares) and len(set(shares)) > 2  # the exact share grows chunk by chunk
    status = work.status()
    assert status.line() == f"document {len(toks):,} tokens, exact" and status.saved and status.cache_entries == 1
    (entry,) = cache.entries()  # the exact one replaced the first
    assert entry.header["exact_rows"] == entry.header["clean_rows"] == len(toks)
    engine.slot.truncate(10)
    assert not work.pending  # the rows it was for are gone


def test_after_a_prefill_stopped_midway_the_status_says_no_save_is_coming(engine, tmp_path):
    toks = induction_prompt(engine, 400)
    engine.slot.prefill(toks, reuse_prefix=False)  # exact rows, as a cancelled exact prefill leaves them
    work = IdleWork(engine, PromptCache(tmp_path / "prompts"))
    work.after_completion()
    assert work.status().line().endswith(", exact, saving")  # the control: a save is due
    work.forget()  # the engine child's answer to a cancelled prefill: nothing to save
    assert work.status().line() == f"document {len(toks):,} tokens, exact"


def test_the_engine_child_refines_when_idle_and_a_request_preempts_it(model_path, tmp_path):
    from app.engine_process import EngineProcess
    from app.engine_protocol import DocumentState, EngineSettings, TaskCancelled, TaskDone, TaskEvent, TaskKind
    from backend.protocol import CompletionRequest, ProgressEvent

    doc = "\n\n".join(corpus_texts())[:7000]
    proc = EngineProcess(EngineSettings(model_path, n_ctx=4096, n_batch=256, n_threads=2), auto_restart=False)
    proc.start()
    seen: list = []

    def wait_for(pred, timeout=600.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in proc.poll():
                seen.append(msg)
                if pred(msg):
                    return msg
            time.sleep(0.02)
        raise AssertionError(f"timed out; last messages {seen[-5:]}")

    try:
        # a prefill cancelled midway: nothing is saved
        tid = proc.submit(TaskKind.COMPLETE, CompletionRequest(prompt=doc, max_tokens=2))
        wait_for(lambda m: isinstance(m, TaskEvent) and m.id == tid and isinstance(m.event, ProgressEvent))
        proc.cancel(tid)
        wait_for(lambda m: isinstance(m, TaskCancelled) and m.id == tid)
        time.sleep(2.0)
        assert PromptCache().entries() == []

        # answered in speed mode: saved, then refined while idle
        tid = proc.submit(TaskKind.COMPLETE, CompletionRequest(prompt=doc, max_tokens=2, mode="speed"))
        done = wait_for(lambda m: isinstance(m, TaskDone) and m.id == tid)
        assert done.result.timings.mode == "speed", done.result.timings.note
        wait_for(lambda m: isinstance(m, DocumentState) and m.status.refining and 0 < m.status.exact_rows)
        tid = proc.submit(TaskKind.PING, None)  # a new task is served between two chunks...
        wait_for(lambda m: isinstance(m, TaskDone) and m.id == tid)
        after = wait_for(lambda m: isinstance(m, DocumentState))  # ...and refinement goes on after it
        assert after.status.refining and after.status.exact_rows < after.status.tokens
        final = wait_for(lambda m: isinstance(m, DocumentState) and not m.status.refining and m.status.saved)
        assert final.status.exact_rows == final.status.tokens and "exact" in final.status.line()
        (entry,) = PromptCache().entries()
        assert entry.header["exact_rows"] == entry.header["n_tokens"] == final.status.tokens
    finally:
        proc.shutdown()
