"""Which models hold a prompt of a given length: the advice a too-long document gets."""
from __future__ import annotations

from backend.errors import DocumentTooLongError

from .catalogue import ModelEntry
from .status import model_rows
from .settings import HubSettings


def models_that_hold(n_tokens: int, entries: list[ModelEntry], settings: HubSettings) -> list[dict]:
    """Catalogue rows (status.model_rows) whose trained context holds `n_tokens`, installed ones first,
    then the smallest."""
    rows = [r for r in model_rows(entries, settings) if (r["context_length"] or 0) >= n_tokens]
    return sorted(rows, key=lambda r: (r["state"] != "installed", r["size_mb"] or float("inf")))


def advice(n_tokens: int, entries: list[ModelEntry], settings: HubSettings, limit: int = 4) -> str:
    """One sentence naming the models that hold `n_tokens` (their context and size), or saying none does."""
    rows = models_that_hold(n_tokens, entries, settings)
    if not rows:
        return f"No model in the catalogue holds {n_tokens:,} tokens: shorten the document."
    named = [f"{r['name']} ({r['context_length'] // 1024}K context, {_size(r['size_mb'])}, {r['state']})"
             for r in rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"Models whose context holds it: {'; '.join(named)}{more} (Models tab, or `python -m app models`)."


def _size(size_mb: float | None) -> str:
    if not size_mb:
        return "size unknown"
    return f"{size_mb / 1000:.2f} GB" if size_mb >= 1000 else f"{size_mb:.0f} MB"


def with_advice(exc: DocumentTooLongError, settings: HubSettings | None = None) -> DocumentTooLongError:
    """The same error, its message naming the installed or catalogue models whose context holds it (an
    error that already says what to do, such as too little memory to grow the context, stays as it is)."""
    from .catalogue import load_catalogue, user_models_file

    if exc.advice or exc.no_memory:  # a larger model's context would not help there
        return exc

    try:
        text = advice(exc.tokens_needed, load_catalogue(user_models_file()), settings or HubSettings(offline=True))
    except Exception:  # noqa: BLE001 - a damaged catalogue must not hide the error itself
        return exc
    return DocumentTooLongError(exc.prompt_tokens, exc.limit, exc.reserved, text)
