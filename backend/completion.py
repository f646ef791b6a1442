"""One request, end to end: the Engine generates, RidgeFill's planner decides how the prompt is
prefilled, and with a prompt cache the longest saved prefix is loaded first (backend/prompt_reuse.py).
Everything that answers a request (the engine process, the CLI, the evals) calls this."""
from __future__ import annotations

from .engine import CancelCheck, Engine, EventSink
from .errors import DocumentTooLongError
from .prompt_cache import PromptCache
from .protocol import CompletionRequest, CompletionResult
from .ridgefill.plan import plan_prefill


def complete(engine: Engine, request: CompletionRequest, *, on_event: EventSink | None = None,
             cancel: CancelCheck | None = None, prompt_cache: PromptCache | None = None) -> CompletionResult:
    """Raises DocumentTooLongError naming the models whose context would hold the prompt."""
    planner = plan_prefill
    if prompt_cache is not None:
        from .prompt_reuse import with_saved_prefixes

        planner = with_saved_prefixes(plan_prefill, prompt_cache)
    try:
        return engine.complete(request, planner=planner, on_event=on_event, cancel=cancel)
    except DocumentTooLongError as exc:
        from .hub.context_fit import with_advice

        raise with_advice(exc) from None
