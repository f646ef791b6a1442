"""Conversations and their documents, one JSON file each in the user data dir.

Each change is written at once and atomically (temp file + os.replace), so a crash of the app or
the engine mid-answer loses at most the tokens since the last write, never the file.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from dataclasses import InitVar, asdict, dataclass, field
from pathlib import Path

from filelock import FileLock

from backend.json_file import parse_object, set_aside, write_private
from backend.private_files import private_dir
from backend.user_paths import data_dir

log = logging.getLogger(__name__)


@dataclass
class Document:
    name: str
    text: str
    page_starts: tuple[int, ...] = ()  # where each PDF page starts in `text` (backend.documents.DocumentText)
    path: str = ""  # the file it was read from, to open it at a source's page ("" when not known)


@dataclass
class Message:
    role: str  # user | assistant
    content: str
    complete: bool = True  # False while streaming, or when the engine died mid-answer
    timings: dict | None = None  # Timings.as_dict() of the answer
    exact: dict | None = None  # compare-with-exact: {"content": ..., "timings": {...}}
    note: str = ""  # e.g. "stopped", or an error
    sources: list[dict] | None = None  # backend.sources.Source.as_dict() of the answer, best first
    # backend.exact_spans.ExactSpan.as_dict(): the documents' text RidgeFill made exact for this answer
    exact_spans: list[dict] | None = None
    # backend.answer_check.AnswerCheck.as_dict(): a RidgeFill answer checked against exact's once its
    # document was exact ("checked", or "corrected": content is then exact's, shown_answer RidgeFill's)
    check: dict | None = None
    extra: dict = field(default_factory=dict)  # fields a newer version wrote: kept and written back as they were


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    documents: list[Document] = field(default_factory=list)  # in the order attached
    messages: list[Message] = field(default_factory=list)
    document: InitVar[Document | None] = None  # one document, as conversations were made before several

    def __post_init__(self, document: Document | None) -> None:
        if isinstance(document, Document) and not self.documents:
            self.documents = [document]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["messages"] = [{**m.pop("extra"), **m} for m in d["messages"]]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Conversation":
        """A conversation from its saved form; ValueError (saying what is wrong) for any other shape."""
        _check_shape(d)
        # Files saved with one "document" (before several) still load; their n_tokens field is dropped.
        docs = d.get("documents") or ([d["document"]] if d.get("document") else [])
        return cls(
            id=d["id"],
            title=str(d.get("title", "Chat")),
            created=float(d.get("created", 0)),
            updated=float(d.get("updated", 0)),
            documents=[Document(x["name"], x["text"], tuple(x.get("page_starts", ())), x.get("path", ""))
                       for x in docs],
            messages=[_message(m) for m in d.get("messages", [])],
        )


def _message(m: dict) -> Message:
    known = {k: v for k, v in m.items() if k in _MESSAGE_TYPES}
    return Message(**known, extra={k: v for k, v in m.items() if k not in _MESSAGE_TYPES})


def _first_document(self: Conversation) -> Document | None:
    return self.documents[0] if self.documents else None


def _only_document(self: Conversation, doc: Document | None) -> None:
    self.documents = [doc] if doc is not None else []


# conv.document: the first document; setting it makes it the only one (callers written for one document).
Conversation.document = property(_first_document, _only_document)


_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the id names the file: no path, nothing hidden
_MESSAGE_TYPES = {"role": (str,), "content": (str,), "complete": (bool,), "timings": (dict, type(None)),
                  "exact": (dict, type(None)), "note": (str,), "sources": (list, type(None)),
                  "exact_spans": (list, type(None)), "check": (dict, type(None))}


def _is_document(doc) -> bool:
    return (isinstance(doc, dict) and isinstance(doc.get("name"), str) and isinstance(doc.get("text"), str)
            and isinstance(doc.get("path", ""), str) and isinstance(doc.get("page_starts", []), list)
            and all(isinstance(x, int) and not isinstance(x, bool) for x in doc.get("page_starts", [])))


def _check_shape(d) -> None:
    """ValueError unless `d` has the shape Conversation.to_dict writes (unknown top-level keys are ignored)."""
    if not isinstance(d, dict):
        raise ValueError(f"a conversation is a JSON object, not a {type(d).__name__}")
    if not isinstance(d.get("id"), str) or not _ID.fullmatch(d["id"]):
        raise ValueError("the conversation has no valid 'id'")
    for key in ("created", "updated"):
        value = d.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"'{key}' is not a time")
    doc = d.get("document")
    if doc and not _is_document(doc):
        raise ValueError("'document' has no text and name")
    docs = d.get("documents", [])
    if not isinstance(docs, list) or not all(_is_document(x) for x in docs):
        raise ValueError("'documents' is not a list of documents with a name and a text")
    messages = d.get("messages", [])
    if not isinstance(messages, list):
        raise ValueError("'messages' is not a list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not {"role", "content"} <= m.keys():
            raise ValueError(f"message {i} is not a message")
        if not all(isinstance(v, _MESSAGE_TYPES[k]) for k, v in m.items() if k in _MESSAGE_TYPES):
            raise ValueError(f"message {i} has a field of the wrong type")


LOCK_TIMEOUT_S = 10  # another process's write takes milliseconds; past this the save fails as a disk error would


def _stamp(path: Path) -> tuple[int, int] | None:
    """Which write of `path` is on disk (each write replaces the file: a new inode), None when there is none."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_mtime_ns


def _json_text(obj: dict) -> str:
    """JSON as UTF-8 text; one holding a lone surrogate (a server's "\\ud800" escape, a document's bytes)
    is written with \\u escapes instead, which UTF-8 cannot hold but JSON reads back as it was."""
    text = json.dumps(obj, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True)
    return text


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else data_dir() / "conversations"
        private_dir(self.folder)

    def file_of(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        """Written whole under a unique temporary name, mode 0600 (a conversation is private). When another
        window or process wrote this conversation since this copy was read or saved, this copy is saved
        as a new conversation beside it instead ("… (copy)"): both are kept, neither overwrites the other."""
        with FileLock(self.folder / ".lock", mode=0o600, timeout=LOCK_TIMEOUT_S):
            if _stamp(self.file_of(conv.id)) not in (None, getattr(conv, "disk_stamp", None)):
                log.warning("conversation %s changed in another window; this copy is kept as a new one", conv.id)
                conv.id, conv.title = uuid.uuid4().hex[:12], f"{conv.title} (copy)"
            conv.updated = time.time()
            write_private(self.file_of(conv.id), _json_text(conv.to_dict()))
            conv.disk_stamp = _stamp(self.file_of(conv.id))

    def load(self, conv_id: str) -> Conversation:
        """One conversation; OSError, or ValueError saying what is wrong with a damaged file."""
        p = self.file_of(conv_id)
        stamp = _stamp(p)
        conv = Conversation.from_dict(parse_object(p.read_bytes().decode("utf-8"), p.name))
        conv.disk_stamp = stamp
        return conv

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, newest first; a damaged file is set aside as NAME.bad-<time>
        (nothing lost, and never loaded again) and logged."""
        out = []
        for p in self.folder.glob("*.json"):
            try:
                out.append(self.load(p.stem))
            except ValueError as exc:  # NotAnObject, UnicodeDecodeError and the shape check are all ValueError
                kept = set_aside(p)
                log.warning("conversation %s is damaged (%s); it was kept as %s", p.name, exc, kept or p)
            except OSError as exc:
                log.warning("skipping unreadable conversation %s: %s", p.name, exc)
        return sorted(out, key=lambda c: c.updated, reverse=True)
