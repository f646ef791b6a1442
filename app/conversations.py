"""Conversations and their documents, one JSON file each in the user data dir; a document's text is in a
side file of its own (documents/<key>.txt), written once, which the chat file names (files from before
hold the text inline and still load), and removed by the writer thread once no chat names it (app/side_files.py).

Each change is written atomically (temp file + os.replace), so a crash of the app or the engine mid-answer
loses at most the tokens since the last write, never the file. The window hands the store a snapshot
(taken on its own thread) and a writer thread writes it (save_later); save() writes at once.
"""
from __future__ import annotations

import json
import logging
import math
import re
import time
import uuid
from dataclasses import InitVar, asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from filelock import FileLock

from app.conversation_writer import CoalescingWriter
from app.side_files import TEXT_FILE, named_in, remove_unnamed, write_once
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
    text_file: str = ""  # the side file that holds `text` (documents/<key>.txt; "" until the chat is saved)


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
    def from_dict(cls, d: dict, read_text: Callable[[str], str] | None = None) -> "Conversation":
        """A conversation from its saved form; ValueError (saying what is wrong) for any other shape.
        `read_text(text_file)` gives the text of a document kept in a side file (OSError when it cannot)."""
        _check_shape(d)
        # Files saved with one "document" (before several) still load; their n_tokens field is dropped.
        docs = d.get("documents") or ([d["document"]] if d.get("document") else [])
        return cls(
            id=d["id"],
            title=str(d.get("title", "Chat")),
            created=float(d.get("created", 0)),
            updated=float(d.get("updated", 0)),
            documents=[_document(x, read_text) for x in docs],
            messages=[_message(m) for m in d.get("messages", [])],
        )


def _document(x: dict, read_text: Callable[[str], str] | None) -> Document:
    if isinstance(x.get("text"), str):  # inline, as files were written before side files
        return Document(x["name"], x["text"], tuple(x.get("page_starts", ())), x.get("path", ""))
    if read_text is None:
        raise ValueError(f"document {x['name']!r} is in a side file and no folder was given to read it from")
    return Document(x["name"], read_text(x["text_file"]), tuple(x.get("page_starts", ())), x.get("path", ""),
                    x["text_file"])


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
    return (isinstance(doc, dict) and isinstance(doc.get("name"), str)
            and (isinstance(doc.get("text"), str)
                 or isinstance(doc.get("text_file"), str) and bool(TEXT_FILE.fullmatch(doc["text_file"])))
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


_READ = "(read)"  # the writer's key of a read (read_later): never a chat's id, which _ID allows


def _writes_of(conv_id: str | None) -> Callable[[tuple], bool]:  # the writer's keys that flush waits for
    return (lambda key: key[0] != _READ) if conv_id is None else (lambda key: key[0] == conv_id)


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


@dataclass(frozen=True)
class Snapshot:
    """A conversation as it is to be written, copied on the thread that changes it: the writer thread reads
    this (strings, numbers and tuples nobody changes), never the conversation itself."""
    id: str
    title: str
    created: float
    updated: float
    documents: tuple[tuple[str, str, tuple[int, ...], str, str], ...]  # name, text_file, page_starts, path, text
    messages_json: str  # the messages as the chat file holds them
    base_stamp: tuple[int, int] | None  # the file's write this copy was loaded from or last saved as
    lineage: str  # which conversation object of this process it is a copy of (the same for all its saves)

    def chat_text(self) -> str:
        """The chat file: everything but the documents' texts, which it names by their side files."""
        head = _json_text({"id": self.id, "title": self.title, "created": self.created, "updated": self.updated,
                           "documents": [{"name": n, "text_file": f, "page_starts": list(p), "path": path}
                                         for n, f, p, path, _ in self.documents]})
        return head[:-1] + ', "messages": ' + self.messages_json + "}"


@dataclass(frozen=True)
class Written:
    id: str  # a new one when the conversation was saved as a copy (another window wrote it meanwhile)
    title: str
    stamp: tuple[int, int] | None


def snapshot(conv: Conversation) -> Snapshot:
    """`conv` as it is now, stamped updated now; a document gets the name of its side file the first time."""
    conv.updated = time.time()
    for d in conv.documents:
        if not d.text_file:
            d.text_file = f"{uuid.uuid4().hex}.txt"
    lineage = conv.__dict__.setdefault("lineage", uuid.uuid4().hex)
    messages = [{**m.extra, **{k: getattr(m, k) for k in _MESSAGE_TYPES}} for m in conv.messages]
    return Snapshot(conv.id, conv.title, conv.created, conv.updated,
                    tuple((d.name, d.text_file, tuple(d.page_starts), d.path, d.text) for d in conv.documents),
                    _json_text(messages), getattr(conv, "disk_stamp", None), lineage)


def apply_written(conv: Conversation, snap: Snapshot, written: Written) -> bool:
    """Tell `conv` where its snapshot went (its id and title when saved as a copy, the file's stamp);
    False when `conv` is not the conversation `snap` was taken of."""
    if conv.__dict__.get("lineage") != snap.lineage or conv.id not in (snap.id, written.id):
        return False
    conv.id, conv.title = written.id, (written.title if written.id != snap.id else conv.title)
    conv.disk_stamp = written.stamp
    return True


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else data_dir() / "conversations"
        self.documents = self.folder / "documents"  # the side files of the documents' texts
        private_dir(self.folder)
        self._written: dict[str, tuple[str, tuple[int, int] | None]] = {}  # id: (lineage, stamp) this store wrote
        self._copies: dict[tuple[str, str], Written] = {}  # (lineage, id): the copy its saves go to
        # one writer thread per store; a conversation's latest snapshot wins (keys: (id, lineage)). Through
        # a lambda: a test that replaces store.write (a full disk) replaces what the thread calls too.
        self._writer = CoalescingWriter(lambda item: self.write(item) if isinstance(item, Snapshot) else item(),
                                        name="conversation writer")

    def file_of(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        """Write `conv` now, on this thread (OSError when the system will not); see write()."""
        snap = snapshot(conv)
        apply_written(conv, snap, self.write(snap))

    def save_later(self, snap: Snapshot, done=None) -> None:
        """Write `snap` on the store's writer thread; a snapshot of the same conversation not written yet is
        dropped for it. done(snap, Written | None, error | None) is called on that thread once written."""
        self._writer.put((snap.id, snap.lineage), snap, done)

    def pending(self, conv_id: str | None = None) -> bool:
        """A snapshot (of `conv_id`; None: any, or a removal; not a read) is waiting for the writer or being written."""
        return self._writer.pending(_writes_of(conv_id))

    def flush(self, conv_id: str | None = None, timeout: float | None = None) -> bool:
        """Wait until the snapshots handed to the writer (of `conv_id`) are written; False on `timeout`."""
        return self._writer.wait(_writes_of(conv_id), timeout)

    def write(self, snap: Snapshot) -> Written:
        """The documents' side files that are not there yet, then the chat file, whole under a unique temporary
        name, mode 0600 (a conversation is private). When another window or process wrote this conversation
        since this copy was read or saved, this copy is saved as a new conversation beside it instead
        ("… (copy)"): both are kept, neither overwrites the other."""
        for _name, text_file, _pages, _path, text in snap.documents:
            write_once(self.documents / text_file, text)
        with self._lock():
            copy = self._copies.get((snap.lineage, snap.id))
            if copy is not None:  # saved as a copy before the window heard of it: its saves go there
                snap = replace(snap, id=copy.id, title=copy.title)
            on_disk = _stamp(self.file_of(snap.id))
            if on_disk not in (None, snap.base_stamp) and self._written.get(snap.id) != (snap.lineage, on_disk):
                log.warning("conversation %s changed in another window; this copy is kept as a new one", snap.id)
                old = snap.id
                snap = replace(snap, id=uuid.uuid4().hex[:12], title=f"{snap.title} (copy)")
                self._copies[(snap.lineage, old)] = Written(snap.id, snap.title, None)
            named_before = named_in(self.file_of(snap.id))
            for _name, text_file, _pages, _path, text in snap.documents:  # removed by a cleanup since: again
                write_once(self.documents / text_file, text)
            write_private(self.file_of(snap.id), snap.chat_text())
            stamp = _stamp(self.file_of(snap.id))
            self._written[snap.id] = (snap.lineage, stamp)
            remove_unnamed(self.folder, self.documents, named_before - {d[1] for d in snap.documents})
        return Written(snap.id, snap.title, stamp)

    def _lock(self) -> FileLock:
        """The chat folder's lock, held by every process's store while it writes a chat or removes a side file."""
        return FileLock(self.folder / ".lock", mode=0o600, timeout=LOCK_TIMEOUT_S)

    def delete_later(self, conv_id: str, done=None) -> None:
        """Remove chat `conv_id` and the side files no other chat names, on the writer thread, after the
        snapshots handed to it before. done(conv_id, removed side files | None, error | None) on that thread."""
        told = None if done is None else lambda _job, removed, error: done(conv_id, removed, error)
        self._writer.put(("delete", conv_id), lambda: self._delete(conv_id), told)

    def remove_unused_later(self) -> None:
        """Remove, on the writer thread, every side file no chat file names (a chat deleted by hand, a crash)."""
        self._writer.put(("unused",), self._remove_unused)

    def _delete(self, conv_id: str) -> list[str]:
        with self._lock():
            named = named_in(self.file_of(conv_id))
            self.file_of(conv_id).unlink(missing_ok=True)
            self._written.pop(conv_id, None)
            return remove_unnamed(self.folder, self.documents, named)

    def _remove_unused(self) -> list[str]:
        with self._lock():
            return remove_unnamed(self.folder, self.documents)

    def read_text(self, text_file: str) -> str:
        """A document's text from its side file (OSError when it is missing)."""
        raw = (self.documents / text_file).read_bytes()
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise ValueError(f"the document's text file {text_file} is damaged ({exc})") from None

    def read_later(self, name: str, job: Callable[[], object]) -> None:
        """Run job() on the writer thread after what was handed to it before (a read there sees every write
        asked before it); one under the same `name` not started yet is dropped for it. Not waited for by flush."""
        self._writer.put((_READ, name), job)

    def load(self, conv_id: str) -> Conversation:
        """One conversation (its snapshots still being written are written first); OSError, or ValueError
        saying what is wrong with a damaged file."""
        self.flush(conv_id)
        return self.read(conv_id)

    def read(self, conv_id: str, read_text: Callable[[str], str] | None = None) -> Conversation:
        """load() without waiting for the writer (its own reads); read_text(text_file): a side file's text."""
        p = self.file_of(conv_id)
        stamp = _stamp(p)
        conv = Conversation.from_dict(parse_object(p.read_bytes().decode("utf-8"), p.name),
                                      read_text or self.read_text)
        conv.disk_stamp = stamp
        return conv

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, newest first; a damaged file is set aside as NAME.bad-<time>
        (nothing lost, and never loaded again) and logged."""
        self.flush()
        read = (self._read_or_set_aside(p, lambda p=p: self.read(p.stem)) for p in sorted(self.folder.glob("*.json")))
        return sorted((c for c in read if c is not None), key=lambda c: c.updated, reverse=True)

    def summaries(self) -> list[Summary]:
        """Each readable conversation's id, title and time, newest first, without reading its documents'
        texts; a damaged file is set aside as load_all does."""
        self.flush()
        return self.read_summaries()

    def read_summaries(self) -> list[Summary]:
        """summaries() without waiting for the writer (the writer thread's own reads)."""
        out = [s for s in map(self._summary_or_set_aside, sorted(self.folder.glob("*.json"))) if s is not None]
        return sorted(out, key=lambda s: s.updated, reverse=True)

    def _summary_or_set_aside(self, p: Path) -> Summary | None:
        def summary() -> Summary:
            d = parse_object(p.read_bytes().decode("utf-8"), p.name)
            _check_shape(d)
            return Summary(d["id"], str(d.get("title", "Chat")), float(d.get("updated", 0)))
        return self._read_or_set_aside(p, summary)

    @staticmethod
    def _read_or_set_aside(p: Path, read):
        try:
            return read()
        except ValueError as exc:  # NotAnObject, UnicodeDecodeError and the shape check are all ValueError
            kept = set_aside(p)
            log.warning("conversation %s is damaged (%s); it was kept as %s", p.name, exc, kept or p)
        except OSError as exc:
            log.warning("skipping unreadable conversation %s: %s", p.name, exc)
        return None


@dataclass(frozen=True)
class Summary:
    """What the conversation list shows of a chat."""
    id: str
    title: str
    updated: float

    @classmethod
    def of(cls, conv: Conversation) -> "Summary":
        return cls(conv.id, conv.title, conv.updated)
