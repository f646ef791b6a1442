"""One request, prompt to answer, read straight through: tokens, room, plan, a saved prefix restored,
the plan run, the answer generated. Everything that answers a request (the engine process, the CLI,
the evals) calls `complete`.

Where things are decided: the mode, split and tail in backend/ridgefill/plan.py (`plan_prefill`); the
saved prefix in backend/prompt_reuse.py; the K/V writes and the row record in backend/slot.py.
"""
from __future__ import annotations

import time

from .engine import CancelCheck, Engine, EventSink
from .errors import DocumentTooLongError
from .generation import generate
from .prompt_cache import PromptCache
from .protocol import CompletionRequest, CompletionResult
from .ridgefill.plan import plan_prefill
from .sampler import SamplerChain
from .stopping import AnswerEnd


def complete(engine: Engine, request: CompletionRequest, *, on_event: EventSink | None = None,
             cancel: CancelCheck | None = None, prompt_cache: PromptCache | None = None,
             plan=None) -> CompletionResult:
    """Raises DocumentTooLongError naming the models whose context would hold the prompt. `plan`: how to
    prefill, decided by the caller (an eval's oracle); None: plan_prefill decides from the request."""
    t_start = time.perf_counter()
    tokens = engine.prompt_tokens(request)
    # the sources' probe decodes its rows beside the prompt and the answer: room for them too
    probe_rows = _source_probe_rows() if request.documents else 0
    try:
        engine.make_room(len(tokens), request.max_tokens + probe_rows)
    except DocumentTooLongError as exc:
        from .hub.context_fit import with_advice

        raise with_advice(exc) from None
    # decided once: an exact plan for a request with documents records each row's cell for the sources
    plan = plan or plan_prefill(engine, request, len(tokens))
    restored = ""
    if prompt_cache is not None and request.reuse_prefix and plan.mode != "plumb":  # plumb starts at 0
        from .prompt_reuse import restore

        restored = restore(engine, prompt_cache, tokens, plan.tag)
    report = plan.run(engine, tokens, reuse_prefix=request.reuse_prefix, on_event=on_event, cancel=cancel)
    report.note = " ".join(n for n in (restored, report.note) if n)
    timings = report.timings(len(tokens))
    t_gen = time.perf_counter()
    max_new = min(request.max_tokens, engine.n_ctx - len(tokens))
    with SamplerChain(request.sampling, n_vocab=engine.n_vocab, n_ctx=engine.n_ctx, vocab=engine.vocab) as sampler:
        ends = engine.answer_stops if request.messages is not None else ()
        end = AnswerEnd(request.stop, stop_loops=request.stop_loops, ends=ends)
        answer = generate(engine, max_new, sampler=sampler, end=end, on_event=on_event, cancel=cancel)
    t_end = time.perf_counter()
    timings.ttft_ms = ((answer.first_token_at or t_end) - t_start) * 1000
    timings.predicted_n = len(answer.tokens)
    timings.predicted_ms = (t_end - t_gen) * 1000
    timings.predicted_per_second = len(answer.tokens) / (t_end - t_gen) if t_end > t_gen and answer.tokens else 0.0
    sources, spans = [], []
    if request.documents and answer.finish_reason != "cancelled":  # after the answer: ttft_ms is not slowed
        sources, spans = _about_documents(engine, tokens, request.documents, timings)
    return CompletionResult(text=answer.text, finish_reason=answer.finish_reason, timings=timings,
                            prompt_tokens=len(tokens), tokens=answer.tokens, sources=sources, exact_spans=spans)


def _source_probe_rows() -> int:
    from .sources import PROBE_ROWS

    return PROBE_ROWS


def _about_documents(engine: Engine, tokens: list[int], documents: list, timings) -> tuple[list, list]:
    """The answer's sources and the document text made exact (read from the row record: no decode), the
    documents placed in the prompt once for both; neither fails the request."""
    from .exact_spans import exact_spans
    from .sources import find_sources, place_documents

    try:
        placed = place_documents(engine, tokens, documents)
    except Exception:  # noqa: BLE001 - each placing again reports its own failure, the answer stands
        placed = None
    return find_sources(engine, tokens, documents, timings, placed), exact_spans(engine, tokens, documents, placed)
