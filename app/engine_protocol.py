"""What crosses the process boundary between the engine child and whoever drives it: plain, picklable
dataclasses and an enum of task kinds. No Qt here (the engine child and a local server import it).

Parent -> child (the task queue):   TaskMessage, StopEngine
Parent -> child (the cancel queue): CancelTask
Child -> parent (the event queue):  EngineStarted, EngineFatal, DocumentState, TaskEvent, TaskDone, TaskFailed,
                                    TaskCancelled
Made by the parent-side handle itself (app/engine_process.py), when the child dies: EngineCrashed,
TaskFailed for the tasks it held, and EngineFatal when it will not be restarted.

Every task ends in exactly one of TaskDone, TaskFailed or TaskCancelled; TaskEvents (progress, tokens,
recall rows) may come before it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from typing import Any, Union

from backend.prompt_cache import DEFAULT_LIMIT_BYTES
from backend.protocol import AUTO_CTX, CompletionRequest, N_BATCH
from backend.ridgefill.defaults import DEFAULT_MODE


class TaskKind(str, Enum):
    COMPLETE = "complete"  # CompletionRequest -> CompletionResult; events ProgressEvent, TokenEvent
    COUNT = "count"  # CountRequest -> CountResult
    MAPS_STATUS = "maps_status"  # MapsStatusRequest -> MapsStatus
    FIT_MAPS = "fit_maps"  # FitMapsRequest -> str (the map folder); events ProgressEvent, StageNote
    GET_MAPS = "get_maps"  # GetMapsRequest -> GetMapsResult (backend/hub/get_maps.py); events ProgressEvent, StageNote
    TUNE = "tune"  # TuneRequest -> TuneDone; events ProgressEvent, StageNote
    RECALL = "recall"  # RecallRequest -> RecallResult; events RecallRow, ProgressEvent
    CACHE_CLEAR = "cache_clear"  # None -> int: the prompt cache's entries removed
    PING = "ping"  # None -> "pong"
    CRASH_FOR_TEST = "crash_for_test"  # None -> the child dies as a segfault would


# ---- how to build the engine ---------------------------------------------------------------------
@dataclass
class EngineSettings:
    """How to build the engine (the child builds an EngineConfig from it; a restart reuses it)."""

    model_path: str
    n_ctx: int = AUTO_CTX  # 0: the context follows the document
    n_threads: int | None = None
    n_batch: int = N_BATCH
    warm_up: bool = True  # probe RidgeFill's graph layout when idle (tests that run exact skip it)
    cache_root: str | None = None  # the user cache (maps, tuned splits, activations); None: backend/user_paths'
    prompt_cache: bool = True  # load saved prompts, save prefilled ones (backend/prompt_cache.py)
    cache_limit_bytes: int = DEFAULT_LIMIT_BYTES
    refine: bool = True  # make approximated rows exact when idle (backend/idle_work.py)


@dataclass
class EngineReady:
    """The engine loaded its model: what the GUI shows and the RidgeFill defaults for this model."""

    pid: int
    model_path: str
    model_name: str
    architecture: str
    n_layer: int
    n_embd: int
    n_ctx: int
    n_ctx_train: int
    default_split: int
    default_tail: int
    min_tail: int
    min_bulk: int
    load_s: float
    tuned: str = ""  # the tuned split's line for the RidgeFill panel ("" when the model was never tuned)
    sampling: tuple = ()  # the file's recommended sampling, as ModelInfo.sampling (backend/sampling.py)
    default_mode: str = DEFAULT_MODE  # the RidgeFill mode this model runs unless asked (defaults.default_mode)

    def as_dict(self) -> dict:
        return asdict(self)


# ---- task payloads and results -------------------------------------------------------------------
@dataclass
class CountRequest:
    """Count the prompt tokens of a request and say whether it fits (before sending it)."""

    request: CompletionRequest
    # True: request.messages[0] holds no document text; the engine child frames request.documents into it
    # (framed()), so the GUI thread never copies a large document's text to ask for a count
    documents_apart: bool = False

    def framed(self) -> CompletionRequest:
        """The request as counted: its documents in its first user turn, as chat_session.history puts them."""
        req = self.request
        if self.documents_apart and req.unframed_documents is None:
            req = replace(req, unframed_documents=req.documents)
        from backend.documents import framed  # the readers are not needed to parse a task

        return framed(req)


@dataclass
class CountResult:
    prompt_tokens: int
    n_ctx: int
    reserve: int
    fits: bool
    message: str = ""


@dataclass
class MapsStatusRequest:
    split: int


@dataclass
class MapsStatus:
    split: int
    status: str  # verified | warning | refused | missing
    reasons: list[str] = field(default_factory=list)
    folder: str = ""


@dataclass
class FitMapsRequest:
    split: int


@dataclass
class GetMapsRequest:
    """Get maps for the engine's model at `split` (cached, else downloaded, else fitted on this engine).
    Hub settings travel as plain values (HubSettings holds a function, which does not pickle)."""

    split: int
    cache_root: str | None = None
    endpoint: str | None = None
    token: str | None = None
    offline: bool = False
    maps_owner: str | None = None
    capture_tokens: int | None = None  # bound a first capture (tests); None: the whole corpus
    capture_seq_tokens: int | None = None


@dataclass
class StageNote:
    """Event of a long task: a sentence to show (the capture's size and disk, resuming, why it fits)."""

    text: str


@dataclass
class TuneRequest:
    budget_s: float | None = None  # None: the tune's default (backend/tuning/tune.py)
    splits: list[int] | None = None
    doc_tokens: int | None = None  # each document cut to this many tokens (None: the tune's default)
    per_doc: int | None = None  # questions a document (None: the tune's default)
    documents: list[str] | None = None  # only these judge-half documents (tests)
    needles: bool = True  # the needle check beside the choice
    yields: bool = False  # started by itself: it gives way (ends cancelled) to any task or idle work waiting
    capture_tokens: int | None = None
    cache_root: str | None = None


@dataclass
class TuneDone:
    split: int
    summary: str  # "S = 12, chosen: recall 12/12 as exact, 1.4× at 4K"
    result: dict  # backend/tuning/tune.py: TuneResult.brief() with the rule's reason
    record_path: str | None = None


@dataclass
class RecallRequest:
    """Arguments for the needle-recall runner (the items are built in the child, where the engine is)."""

    lengths: list[int]
    depths: list[float]
    modes: list[str]
    split: int | None
    tail: int | None
    document: str | None = None
    out_path: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class RecallRow:
    """Event of a recall task: one scored (item, mode) pair, sent while the run goes on."""

    done: int
    total: int
    row: dict


@dataclass
class RecallResult:
    rows: list[dict]
    summary: dict
    out_path: str | None = None
    notes: list[str] = field(default_factory=list)


# The payload each kind takes: checked when a task is submitted, so a wrong one fails at once, in
# the caller, instead of inside the child.
PAYLOAD_TYPES: dict[TaskKind, type | tuple[type, ...]] = {
    TaskKind.COMPLETE: CompletionRequest,
    TaskKind.COUNT: CountRequest,
    TaskKind.MAPS_STATUS: MapsStatusRequest,
    TaskKind.FIT_MAPS: FitMapsRequest,
    TaskKind.GET_MAPS: GetMapsRequest,
    TaskKind.TUNE: TuneRequest,
    TaskKind.RECALL: RecallRequest,
    TaskKind.CACHE_CLEAR: type(None),
    TaskKind.PING: type(None),
    TaskKind.CRASH_FOR_TEST: type(None),
}


# ---- envelopes: parent -> child ------------------------------------------------------------------
@dataclass(frozen=True)
class TaskMessage:
    id: int
    kind: TaskKind
    payload: Any = None


@dataclass(frozen=True)
class CancelTask:
    """Stop task `id` at its next check (between prefill chunks, tokens, recall items), or before it starts."""

    id: int


@dataclass(frozen=True)
class StopEngine:
    """Finish: the child closes the engine and exits."""


# ---- envelopes: child (or the handle) -> parent --------------------------------------------------
@dataclass(frozen=True)
class EngineStarted:
    ready: EngineReady


@dataclass(frozen=True)
class EngineFatal:
    """The engine cannot run (a bad model file, repeated crashes); it is not restarted."""

    error_type: str
    message: str


@dataclass(frozen=True)
class EngineCrashed:
    """The child died; its tasks failed and a new child is starting with the same settings."""

    message: str


@dataclass(frozen=True)
class DocumentState:
    """The prompt the engine holds, as it is saved and refined while idle (backend/idle_work.py's
    DocumentStatus); sent after each answer and as the idle work goes on."""

    status: Any


@dataclass(frozen=True)
class TaskEvent:
    id: int
    event: Any  # ProgressEvent | TokenEvent | RecallRow | ...


@dataclass(frozen=True)
class TaskDone:
    id: int
    result: Any


@dataclass(frozen=True)
class TaskFailed:
    id: int
    error_type: str  # the exception's class name, e.g. DocumentTooLongError, ModelFileError, EngineError
    message: str


@dataclass(frozen=True)
class TaskCancelled:
    id: int
    message: str = "cancelled"


TaskEnd = Union[TaskDone, TaskFailed, TaskCancelled]
EngineMessage = Union[EngineStarted, EngineFatal, EngineCrashed, DocumentState, TaskEvent, TaskDone, TaskFailed, TaskCancelled]
