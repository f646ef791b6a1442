"""What a prefill reports, and the exact prefill: the plan that `backend/ridgefill/plan.py` falls back to.

A request's prefill runs one plan (`ExactPrefill` here, or RidgeFill's `RidgeFillPlan`); its
`PrefillReport` is the prompt half of the request's Timings (`timings_of`), so the two share their fields
by construction.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .protocol import Timings

# Timings' prompt-side fields a prefill reports; the answer's (predicted_*, ttft_ms) come from generation.
_PROMPT_FIELDS = ("mode", "split", "tail", "bulk_n", "exact_n", "cache_n", "prompt_ms", "breakdown_ms")


@dataclass
class PrefillReport:
    """What a prefill did."""

    mode: str = "off"  # the mode that ran: "off" when RidgeFill was refused
    split: int | None = None
    tail: int | None = None
    bulk_n: int = 0  # rows that took the RidgeFill path
    exact_n: int = 0  # bulk rows made exact again through every layer (quality, guided)
    cache_n: int = 0
    prompt_ms: float = 0.0
    breakdown_ms: dict = field(default_factory=dict)  # RidgeFill's phases (lower, predict, write, ..., tail)
    note: str = ""  # why the requested mode did not run as asked, if it did not
    warnings: list[str] = field(default_factory=list)

    def timings(self, n_prompt: int) -> Timings:
        """The prompt half of a request's Timings, for a prompt of `n_prompt` tokens."""
        exact = self.mode == "off"  # an exact prefill reports no RidgeFill fields
        kept = {f: getattr(self, f) for f in _PROMPT_FIELDS
                if not (exact and f in ("split", "tail", "bulk_n", "exact_n", "breakdown_ms"))}
        t = Timings(**{k: (dict(v) if isinstance(v, dict) else v) for k, v in kept.items()})
        t.note = " ".join([self.note] + [f"maps warning: {w}" for w in self.warnings]).strip()
        t.prompt_n = n_prompt - self.cache_n
        t.prompt_per_second = t.prompt_n / (self.prompt_ms / 1000) if self.prompt_ms > 0 else 0.0
        return t


@dataclass(frozen=True)
class ExactPrefill:
    """The exact model, chunk by chunk; `note` says why a RidgeFill request came here, if it did. Frozen:
    decided once by backend/ridgefill/plan.py, never changed after."""

    note: str = ""
    mode: str = "off"
    tag: str | None = None  # exact rows only: what prefix reuse accepts
    # Where RidgeFill's layout is known and the request has documents: makes the eval hook that records
    # each row's cell (cache_layout.CellTap), so the answer's sources can read the rows' keys
    # (backend/sources.py). Decided by the planner, made fresh for each run.
    cells: Callable[[], object] | None = None

    def run(self, engine, tokens, *, reuse_prefix, on_event, cancel) -> PrefillReport:
        hook = self.cells() if self.cells is not None else None
        cache_n, ms = engine.slot.prefill(tokens, reuse_prefix=reuse_prefix, on_event=on_event, cancel=cancel,
                                          hook=hook)
        return PrefillReport(mode="off", cache_n=cache_n, prompt_ms=ms, note=self.note)
