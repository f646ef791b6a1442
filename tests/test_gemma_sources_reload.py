"""Issue 38 on the real sliding-window model: a Gemma 3 270M chat on a short document, saved to the prompt
cache and reloaded by a new engine, still has its sources, and they are the ones the first engine found
(before, every reloaded row had cell -1: "no document row has a known cache cell")."""
from __future__ import annotations

import time

import pytest

from tests.test_ridgefill_archs import gemma3_path  # noqa: F401  (the fixture: the model assembled once)

FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
FACT = "The lighthouse keeper of Port Ellis is named Marta Quillfeather."


@pytest.mark.slow
def test_gemma3_sources_survive_a_prompt_cache_reload(gemma3_path, tmp_path):  # noqa: F811
    from backend.completion import complete
    from backend.documents import DocumentText, document_messages
    from backend.engine import Engine, EngineConfig
    from backend.prompt_cache import PromptCache
    from backend.prompt_reuse import save_rows
    from backend.protocol import CompletionRequest

    doc = DocumentText("notes.txt", FILLER * 14 + FACT + " " + FILLER * 14)  # longer than the 512-row window
    request = CompletionRequest(messages=document_messages([doc], "Who keeps the lighthouse of Port Ellis?"),
                                documents=[doc], max_tokens=4, mode="off")
    cache = PromptCache(tmp_path / "prompts")
    t0 = time.perf_counter()
    with Engine(EngineConfig(gemma3_path, n_ctx=2048, n_threads=2)) as a:
        first = complete(a, request, prompt_cache=cache)
        assert first.sources, first.timings.note
        assert save_rows(a, cache) is not None  # exact rows: a sliding-window model's prompt is saved
    with Engine(EngineConfig(gemma3_path, n_ctx=2048, n_threads=2)) as b:
        again = complete(b, request, prompt_cache=cache)
    t = again.timings
    assert t.cache_n >= first.prompt_tokens - 1 and "prompt cache" not in t.note, t.note  # it was reloaded
    assert "no sources" not in t.note and again.sources, t.note
    for s in again.sources:  # each points at its passage in the document's text
        assert s.document == "notes.txt" and doc.text[s.start : s.end] == s.text
    # the same top passage with the same weight; the lower ones weigh under 0.001 here, where a rounding
    # of the reloaded cache may reorder them
    assert (again.sources[0].start, again.sources[0].end) == (first.sources[0].start, first.sources[0].end)
    assert [s.score for s in again.sources] == pytest.approx([s.score for s in first.sources], abs=0.01)
    assert FACT in again.sources[0].text
    print(f"gemma3 sources reload: {time.perf_counter() - t0:.0f} s, {first.prompt_tokens} prompt rows, "
          f"top source {again.sources[0].text!r}")
