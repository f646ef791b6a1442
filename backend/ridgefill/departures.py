"""The guard each document gets from the check: once the check (backend/answer_check.py) has corrected a
RidgeFill answer about a document, that document runs exact from then on with this model, split and maps,
and every answer about it says why.

The check measures the departure exactly (both replies teacher-forced on the exact cache), where no cheap
signal read before the answer tracked it: the maps' error on the document's first rows, its continuation's
ΔNLL and a copy probe all rank a departing document like the others
(docs/LONG_DOCUMENTS.md#a-guard-that-falls-back-2026-12-07). Kept in the user's data folder
(departed-documents.json, one entry per document, model, split and maps), so it holds after a restart.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

from ..json_file import read_object, write_private

log = logging.getLogger(__name__)

FILE_NAME = "departed-documents.json"
MAX_ENTRIES = 10_000  # the oldest go first: the file stays small (about 200 bytes an entry)


def document_key(model_path: str, split: int, maps_folder: str, documents) -> str:
    """One document set (request.documents: DocumentText) read with this model file, split and maps."""
    h = hashlib.sha256()
    for part in (Path(model_path).name, str(split), Path(str(maps_folder)).name):
        h.update(part.encode("utf-8", "surrogatepass") + b"\0")
    for doc in documents:
        h.update(hashlib.sha256(doc.text.encode("utf-8", "surrogatepass")).digest())
    return h.hexdigest()


class Departures:
    """The documents whose RidgeFill answer the check corrected, in the file `folder()` names (asked each
    time: the data folder may move), read once per folder and written whole on each new entry."""

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
        """The note a request about this document runs exact with; None when it has not departed."""
        entry = self._loaded().get(key)
        if entry is None:
            return None
        dnll, within = entry.get("dnll"), entry.get("within")
        beyond = f", more than the check's {within:g}" if isinstance(within, (int, float)) else ""
        by = f" (ΔNLL {dnll:+.2f} nats/token{beyond})" if isinstance(dnll, (int, float)) else ""
        return (f"RidgeFill: exact for this document: an earlier RidgeFill answer about it was corrected by "
                f"the check against exact's{by}: ran exact.")

    def record(self, key: str, names: list[str], dnll: float | None, within: float | None = None) -> None:
        """`key`'s document departed by `dnll`, past the check's threshold `within` (the caller's: the check
        owns it); written at once (a failed write is logged: the guard then holds until the app ends)."""
        entries = self._loaded()
        entries.pop(key, None)
        entries[key] = {"documents": names[:8], "dnll": dnll, "within": within,
                        "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
        while len(entries) > MAX_ENTRIES:
            del entries[next(iter(entries))]
        try:
            write_private(self.path, json.dumps(entries, ensure_ascii=True, indent=1))
        except OSError as exc:
            log.warning("the departed documents' list could not be written (%s): kept until the app ends", exc)
