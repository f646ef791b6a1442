"""Typed errors the backend raises. Each message says what happened and what the user can do."""


class RidgeFillError(Exception):
    """Base of every error the backend raises on purpose."""


class ModelFileError(RidgeFillError):
    """A model path that is missing, not a GGUF file, or corrupt."""


class DocumentError(RidgeFillError):
    """A document that cannot be sent: empty, unreadable, or too long."""


class EmptyDocumentError(DocumentError):
    pass


class DocumentTooLongError(DocumentError):
    def __init__(self, prompt_tokens: int, limit: int, reserved: int, advice: str = "", *, no_memory: bool = False):
        self.prompt_tokens = prompt_tokens
        self.limit = limit
        self.reserved = reserved
        self.advice = advice  # which models would hold it (backend.hub.context_fit), where known
        self.no_memory = no_memory  # the model holds it, but the context could not grow for lack of memory
        what = ("This machine has not enough free memory for a larger context: close other programs, or use "
                "a shorter document." if no_memory else
                "Shorten the document, or raise the context size if the model supports it.")
        super().__init__(
            f"The prompt has {prompt_tokens:,} tokens, but the context holds {limit:,} "
            f"({reserved:,} of them kept for the answer, so at most {limit - reserved:,} for the prompt). "
            + what + (f" {advice}" if advice else "")
        )

    @property
    def tokens_needed(self) -> int:
        """The context a model needs for this prompt and its answer."""
        return self.prompt_tokens + self.reserved


class Cancelled(RidgeFillError):
    """A request stopped by the user between chunks. The work done so far stays cached."""


class Preempted(RidgeFillError):
    """Idle work (a refinement chunk) stopped inside a decode because a task arrived; nothing of the
    stopped batch stays, and the work goes on from where it was later."""


class EngineError(RidgeFillError):
    """llama.cpp failed (decode error, context could not be created, engine process died)."""
