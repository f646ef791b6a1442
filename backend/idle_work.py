"""What the engine does while no task waits: sequence 0's prompt saved to the prompt cache, its
approximated rows made exact (ridgefill/refine.py), the answer RidgeFill gave then checked against
exact's on that exact cache (answer_check.py), and the prompt saved again, exact.

The one owner of that work, a cooperative task: `step()` does one piece (one save, or one refinement
chunk) and returns; whoever runs the engine (the engine child, `chat --refine`) calls it while nothing
else waits, so a new task preempts it at the next piece boundary, or inside a refinement chunk's
decode (llama.cpp's abort callback: the stopped chunk is redone later). There is work only for a prompt that
was prefilled whole and answered (`after_completion`); a task that used the context otherwise, or a
prefill that was cancelled midway, leaves nothing to save (`forget`).
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Callable

from .errors import Cancelled, Preempted, RidgeFillError
from .prompt_cache import PromptCache
from .prompt_reuse import held_back, save_rows

log = logging.getLogger(__name__)

HELD_BACK_NOTE = "not saved: on this model a document is saved once it is exact (after refinement)"


@dataclass
class DocumentStatus:
    """The prompt the engine holds, as the status bar and /health show it."""

    tokens: int = 0
    exact_rows: int = 0  # the leading rows as the exact model wrote them
    refining: bool = False
    saved: bool = False  # on disk as it is now
    saving: bool = False  # a save of it as it is now is due (none is, after a prefill that stopped midway)
    note: str = ""  # why refinement or saving stopped, if they did
    answer_check: dict | None = None  # the last RidgeFill answer checked against exact's (AnswerCheck.as_dict)
    cache_entries: int = 0
    cache_bytes: int = 0
    cache_limit: int = 0

    def line(self) -> str:
        """"document 4,110 tokens, 62% exact", then "document 4,110 tokens, exact" (", saving" until the
        exact rows are on disk, where there is a prompt cache: closing the app before then loses them)."""
        if not self.tokens:
            return ""
        if self.exact_rows < self.tokens:
            return f"document {self.tokens:,} tokens, {self.exact_rows / self.tokens:.0%} exact"
        return f"document {self.tokens:,} tokens, exact{', saving' if self.saving else ''}"

    def as_dict(self) -> dict:
        return asdict(self)


class IdleWork:
    """Save, refine, save again: for `engine`'s sequence 0, one piece per `step()`."""

    def __init__(self, engine, cache: PromptCache | None, *, refine: bool = True, check: bool = True):
        self.engine = engine
        self.cache = cache
        self.refine = refine
        self.check = check and refine  # a check needs the exact cache refinement makes
        self._to_check = None  # (request, result) of the last answer with approximated rows
        self.last_check = None  # answer_check.AnswerCheck, once made
        self._document: list[int] | None = None  # the tokens the work is for
        self._saved = False
        self._held_back = False  # the last save wrote nothing: sequence 0 is saved once exact
        self._save_note = self._refine_note = ""
        self._refinement = None

    def after_completion(self, request=None, result=None) -> None:
        """The engine just answered a prompt it prefilled whole: save and refine what it holds, and check
        `result` (the answer to `request`) against exact's once it is exact, if RidgeFill approximated rows."""
        self._document = self.engine.slot.tokens
        approximated = result is not None and result.timings.bulk_n > 0 and result.finish_reason != "cancelled"
        self._to_check = (request, result) if self.check and approximated else None
        self.last_check = None  # it was for the answer before
        self._saved = self._held_back = False
        self._save_note = self._refine_note = ""

    def forget(self) -> None:
        """The context was used for something else (or a prefill stopped midway): nothing to do."""
        self._document = None
        self._to_check = None

    @property
    def pending(self) -> bool:
        if self._document is None or self.engine.slot.tokens != self._document:
            return False
        return (not self._saved and self.cache is not None) or self._may_refine() or self._check_due()

    def _check_due(self) -> bool:
        return self._to_check is not None and self.engine.slot.record.all_exact

    def _may_refine(self) -> bool:
        return self.refine and not self._refine_note and not self.engine.slot.record.all_exact

    def step(self, should_stop: Callable[[], bool] | None = None) -> bool:
        """One piece of the work; False when there was none. `should_stop` is asked between pieces of
        a save and inside a refinement chunk's decode (a stopped piece is done again later)."""
        if not self.pending:
            return False
        if self._check_due():  # before the exact save
            self._check_answer(should_stop)
            return True
        if self.cache is not None and not self._saved:
            self._save(should_stop)
            return True
        self._refine_chunk(should_stop)
        if self.engine.slot.record.all_exact:
            self._saved = False  # save it again, exact
        return True

    def _save(self, should_stop: Callable[[], bool] | None) -> None:
        try:
            entry = save_rows(self.engine, self.cache, cancel=should_stop)
        except Exception as exc:  # noqa: BLE001 - a failed save (full disk, a bug) loses the save, never the live K/V
            log.warning("prompt cache: saving failed: %s", exc, exc_info=not isinstance(exc, OSError))
            self._save_note = f"the prompt could not be saved ({getattr(exc, 'strerror', None) or exc})"
            self._saved = True
            return
        self._saved = entry is not None or should_stop is None or not should_stop()  # a stopped save runs again
        self._held_back = entry is None and held_back(self.engine)

    def _refine_chunk(self, should_stop: Callable[[], bool] | None) -> None:
        from .ridgefill.refine import Refinement

        if self._refinement is None or self._refinement.engine is not self.engine:
            self._refinement = Refinement(self.engine)
        try:
            self._refinement.step(abort=should_stop)
        except Preempted:  # a task came: it runs now, and this chunk again afterwards
            log.debug("refinement chunk stopped for a new task")
        except RidgeFillError as exc:  # refused (a sliding-window model, a full context) or a graph surprise
            log.info("refinement stopped: %s", exc)
            self._refinement.close()
            self._refine_note = f"refinement stopped: {exc}"

    def _check_answer(self, should_stop: Callable[[], bool] | None) -> None:
        from .answer_check import check_answer

        request, result = self._to_check
        try:
            self.last_check = check_answer(self.engine, request, result, cancel=should_stop)
        except (Preempted, Cancelled):  # a task came: checked afterwards, if it leaves the document as it is
            self._document = self.engine.slot.tokens
            return
        except Exception as exc:  # noqa: BLE001 - a failed check leaves the answer as it was, said so
            log.warning("answer check failed: %s", exc, exc_info=True)
            self._refine_note = f"the answer could not be checked against exact's ({exc})"
        if self.last_check is not None:
            _guard_from_check(self.engine, request, result, self.last_check)
        self._to_check = None
        self._document = self.engine.slot.tokens  # as answered, every row exact now
        self._saved = False

    def run(self, should_stop: Callable[[], bool] | None = None) -> None:
        """Steps until there is no work left or `should_stop()` (the CLI: until the end)."""
        while not (should_stop is not None and should_stop()) and self.step(should_stop):
            pass

    def status(self) -> DocumentStatus:
        rows = self.engine.slot.record
        held_back = self._held_back and not rows.all_exact
        never_exact = held_back and not self._may_refine()  # nothing will make it exact, so it stays unsaved
        st = DocumentStatus(tokens=len(rows), exact_rows=rows.n_clean, refining=self.pending and self._may_refine(),
                            saved=self._saved and not self._save_note and not held_back and self._document is not None,
                            saving=self.cache is not None and self.pending and not self._saved,
                            note=" ".join(n for n in (self._save_note, self._refine_note,
                                                      HELD_BACK_NOTE if never_exact else "") if n),
                            answer_check=self.last_check.as_dict() if self.last_check is not None else None)
        if self.cache is not None:
            entries = self.cache.entries()
            st.cache_entries, st.cache_bytes = len(entries), sum(e.n_bytes for e in entries)
            st.cache_limit = self.cache.limit_bytes
        return st


def _guard_from_check(engine, request, result, check) -> None:
    """A RidgeFill answer's check counts toward its document's guard: once its checks surely depart, the
    document runs exact from now on (ridgefill/departures.py)."""
    from .answer_check import WITHIN_NLL
    from .ridgefill.departures import document_key, question_digest
    from .ridgefill.runtime import runtime

    t = result.timings
    if check.dnll is None or not request.documents or t.mode in ("off", "plumb") or t.split is None:
        return  # (plumb writes the true inputs: its maps are not what would depart)
    rt = runtime(engine)
    try:
        folder = getattr(rt.maps(t.split), "folder", "")
    except RidgeFillError as exc:  # the maps went meanwhile: nothing they would run again
        log.info("a checked answer's maps are gone (%s): no guard recorded", exc)
        return
    rt.departures.checked(document_key(engine.info.path, t.split, folder, request.documents),
                          [d.name for d in request.documents], question_digest(request), check.dnll, WITHIN_NLL)

