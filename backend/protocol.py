"""Plain dataclasses the engine takes and returns, so it can run behind a process boundary."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from .sampling import GREEDY, SamplingParams

Mode = Literal["off", "default", "speed", "quality", "guided", "plumb"]
MODEL_DEFAULT = "default"  # a request's mode: the model's own, resolved where split and tail are (plan.py)
# Every mode a request may ask for, in the order the UI offers them; all but "off" are RidgeFill's.
# plumb is the oracle (true late-layer inputs through the same write path): for tests and evals.
MODES: tuple[str, ...] = ("off", "speed", "quality", "guided", "plumb")
RIDGEFILL_MODES: tuple[str, ...] = MODES[1:]

DEFAULT_N_CTX = 8192  # context asked for unless told; the engine caps it at the model's training context
# n_ctx 0: the context follows the document, up to the model's trained context and what RAM allows
# (Engine.n_ctx_max); it starts at 4,096 tokens and grows when a prompt needs more (Engine.make_room).
AUTO_CTX = 0
DEFAULT_MAX_TOKENS = 256  # room kept for each answer unless told
# prefill chunk size: progress and cancel happen between chunks (the engine's batch and ubatch)
N_BATCH = 512


@dataclass
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: str


@dataclass
class CompletionRequest:
    """One request: either chat messages (formatted with the model's template) or a raw prompt."""

    messages: list[ChatMessage] | None = None
    prompt: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = GREEDY  # greedy unless told (backend/sampling.py: model_defaults for people)
    stop: list[str] = field(default_factory=list)  # the answer ends before the first of these
    stop_loops: bool = False  # end an answer that says one sentence three times (finish_reason "loop")
    mode: Mode = "off"
    split: int | None = None  # RidgeFill split S; None = the model's default
    tail: int | None = None  # exact tail T; None = the default
    quality_share: float | None = None  # quality: share of bulk rows made exact; None = the default
    window_bulk: bool | None = None  # bulk attention below the split windowed; None = the model's default
    reuse_prefix: bool = True  # reuse a matching cached prompt prefix (cache_n > 0)
    # The documents the messages frame (backend.documents.DocumentText: name, text, page starts), in the
    # order attached: the answer's sources point into them (backend/sources.py). None: no documents.
    documents: list | None = None
    # The answer comes back only once it is checked against exact's (the document refined, then the check:
    # backend/answer_check.py), with the verdict in CompletionResult.check: the server's ridgefill.check.
    wait_check: bool = False
    # The documents (DocumentText) messages[0] leaves out, sent apart from it by reference: whoever runs the
    # request frames them in first (backend.documents.framed), so the GUI thread sends a large document
    # without copying it. The same list as `documents` for an answer; an exact run for comparison has these
    # and no `documents`.
    unframed_documents: list | None = None


@dataclass
class Timings:
    """Field names follow llama.cpp server where they exist."""

    prompt_n: int = 0  # prompt tokens processed by this request (not counting cache_n)
    prompt_ms: float = 0.0
    prompt_per_second: float = 0.0
    predicted_n: int = 0
    predicted_ms: float = 0.0
    predicted_per_second: float = 0.0
    cache_n: int = 0  # prompt tokens reused from the previous request's cache
    ttft_ms: float = 0.0  # request start to the first generated token
    mode: str = "off"  # the mode that actually ran (a refused RidgeFill request runs "off")
    split: int | None = None
    tail: int | None = None
    bulk_n: int = 0  # rows that took the RidgeFill path
    exact_n: int = 0  # quality: bulk rows made exact again through every layer
    note: str = ""  # why a requested mode did not run, if it did not
    breakdown_ms: dict = field(default_factory=dict)  # RidgeFill prefill phases (lower, predict, write, tail)
    sources_ms: float = 0.0  # finding the answer's sources, after the answer (not in ttft_ms)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class CompletionResult:
    text: str
    finish_reason: Literal["stop", "length", "cancelled", "loop"]
    timings: Timings
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    sources: list = field(default_factory=list)  # backend.sources.Source: where the answer looked, best first
    # backend.exact_spans.ExactSpan: the document text whose rows are exact after an approximating run (none
    # when every row is): what RidgeFill looked at, shaded in the GUI
    exact_spans: list = field(default_factory=list)
    check: dict | None = None  # AnswerCheck.as_dict() where the request waited for it (wait_check)


@dataclass
class ProgressEvent:
    """Sent after each prefill chunk."""

    done: int  # prompt tokens processed so far (cache_n included)
    total: int
    elapsed_ms: float
    stage: str = "prefill"


@dataclass
class TokenEvent:
    """Sent for each generated token; `text` may be empty while a UTF-8 character is incomplete or what
    could start a stop string is held back (token -1: held text given out after the last token). The
    streamed texts add up to the answer's text."""

    token: int
    text: str
