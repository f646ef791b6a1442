"""The guard each document gets from the check: once the checks (backend/answer_check.py) of RidgeFill's
answers about a document say, with 95% confidence, that RidgeFill moves exact's replies there beyond the
yardstick, that document runs exact from then on with this model, split and maps, and every answer about
it says why.

One corrected answer is not enough: on the judge half, q8_0's cache (the yardstick itself) would have
had an answer corrected on every document within 1-21 questions, and so would the default; a mean over a
few checks is ruled by one outlier (docs/LONG_DOCUMENTS.md#a-guard-that-falls-back-2026-12-07). So the
rule is a one-sided Student t bound: after at least MIN_CHECKS checks of a document, the lower 95% bound
of their mean ΔNLL above the check's own threshold. No cheap signal read before the answer tracked the
departure (the maps' error, the continuation's ΔNLL, a copy probe), so the check is what measures it.
Kept in the user's data folder (departed-documents.json, one entry per document, model, split and maps),
so it holds after a restart.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from pathlib import Path

from ..json_file import read_object, write_private

log = logging.getLogger(__name__)

FILE_NAME = "departed-documents.json"
MAX_ENTRIES = 10_000  # the oldest go first: the file stays small (at most about 4 KB an entry)
MIN_CHECKS = 3  # a bound on fewer checks says nothing (the t quantile of 1 degree of freedom is 6.3)
KEPT_CHECKS = 64  # a document's latest checks (one a question), enough for the bound
# Student t's one-sided 95% quantiles by degrees of freedom (a table: the standard library has none), then
# the normal's
T95 = {2: 2.920, 3: 2.353, 4: 2.132, 5: 2.015, 6: 1.943, 7: 1.895, 8: 1.860, 9: 1.833, 10: 1.812, 15: 1.753,
       20: 1.725, 30: 1.697, 40: 1.684, 60: 1.671}
Z95 = 1.645


def document_key(model_path: str, split: int, maps_folder: str, documents) -> str:
    """One document set (request.documents: DocumentText) read with this model file, split and maps."""
    h = hashlib.sha256()
    for part in (Path(model_path).name, str(split), Path(str(maps_folder)).name):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for doc in documents:
        h.update(hashlib.sha256(doc.text.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


class Departures:
    """Each document's checks and whether it departed, in the file `folder()` names (asked each time: the
    data folder may move), read once per folder and written whole on each check."""

    def __init__(self, folder):
        self.folder = folder
        self._read: dict[Path, dict] = {}

    @property
    def path(self) -> Path:
        return Path(self.folder()) / FILE_NAME

    def _loaded(self) -> dict:
        path = self.path
        if path not in self._read:
            data = read_object(path, "the departed documents' list")
            self._read[path] = {k: v for k, v in (data or {}).items() if isinstance(v, dict)}
        return self._read[path]

    def why(self, key: str) -> str | None:
        """The note a request about this document runs exact with (the checks it departed with); None when
        it has not departed (an entry of the one-correction rule, which kept no checks, counts as not)."""
        entry = self._loaded().get(key)
        departed = _numbers(entry.get("departed_with")) if entry is not None else []
        if not departed:
            return None
        within = entry.get("within")
        beyond = f" beyond the check's {within:g}" if isinstance(within, (int, float)) else ""
        return (f"RidgeFill: exact for this document: the checks of {len(departed)} RidgeFill answers about it "
                f"found exact's replies moved by {statistics.fmean(departed):+.2f} nats/token on average, "
                f"surely{beyond} (95% confidence): ran exact.")

    def checked(self, key: str, names: list[str], question: str, dnll: float, within: float) -> bool:
        """A check of an answer to `question` (a digest: the same question asked again counts once, its
        latest check) about `key`'s document found `dnll` (its threshold `within`: the caller's, the check
        owns it); True when the document departs from now on. Written at once (a failed write is logged:
        the guard then holds until the app ends)."""
        entries = self._loaded()
        entry = entries.pop(key, None) or {}
        checks = _checks(entry.get("checks"))
        if _finite(dnll):
            checks.pop(question, None)
            checks[question] = float(dnll)
        checks = dict(list(checks.items())[-KEPT_CHECKS:])
        dnlls = list(checks.values())
        departed_with = _numbers(entry.get("departed_with")) or (dnlls if departs(dnlls, within) else [])
        entries[key] = {"documents": names[:8], "checks": checks, "within": within, "departed_with": departed_with,
                        "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
        while len(entries) > MAX_ENTRIES:
            del entries[next(iter(entries))]
        try:
            write_private(self.path, json.dumps(entries, ensure_ascii=True, indent=1))
        except OSError as exc:
            log.warning("the departed documents' list could not be written (%s): kept until the app ends", exc)
        return bool(departed_with)


def question_digest(request) -> str:
    """Which question a request asks (its prompt and messages), for checked(): a short digest."""
    messages = [(m.role, m.content) for m in (request.messages or [])]
    return hashlib.sha256(repr((request.prompt, messages)).encode("utf-8", "surrogatepass")).hexdigest()[:16]


def departs(dnlls: list[float], within: float) -> bool:
    """The lower one-sided 95% Student t bound of the checks' mean ΔNLL is above `within`."""
    n = len(dnlls)
    if n < MIN_CHECKS:
        return False
    df = n - 1
    t = T95[max(k for k in T95 if k <= df)] if df <= max(T95) else Z95
    return statistics.fmean(dnlls) - t * statistics.stdev(dnlls) / math.sqrt(n) > within


def _finite(v) -> bool:
    try:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    except OverflowError:  # an integer too large for a float (a hand-edited file)
        return False


def _numbers(value) -> list[float]:
    """The finite numbers of a list read from the file (anything else in it is dropped)."""
    return [float(v) for v in value if _finite(v)] if isinstance(value, list) else []


def _checks(value) -> dict[str, float]:
    """A document's checks read from the file: question digest -> ΔNLL (anything else dropped)."""
    return {k: float(v) for k, v in value.items() if isinstance(k, str) and _finite(v)} if isinstance(value, dict) else {}
