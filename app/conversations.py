"""Conversations and their documents, one JSON file each in the user data dir.

Each change is written at once and atomically (temp file + os.replace), so a crash of the app or
the engine mid-answer loses at most the tokens since the last write, never the file.
"""
from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from backend.user_paths import data_dir

log = logging.getLogger(__name__)


@dataclass
class Document:
    name: str
    text: str


@dataclass
class Message:
    role: str  # user | assistant
    content: str
    complete: bool = True  # False while streaming, or when the engine died mid-answer
    timings: dict | None = None  # Timings.as_dict() of the answer
    exact: dict | None = None  # compare-with-exact: {"content": ..., "timings": {...}}
    note: str = ""  # e.g. "stopped", or an error


@dataclass
class Conversation:
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    title: str = "New chat"
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    document: Document | None = None
    messages: list[Message] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Conversation":
        doc = d.get("document")
        return cls(
            id=str(d["id"]),
            title=str(d.get("title", "Chat")),
            created=float(d.get("created", 0)),
            updated=float(d.get("updated", 0)),
            # Files saved before Document lost its n_tokens field still carry it: keep name and text.
            document=Document(str(doc["name"]), str(doc["text"])) if doc else None,
            messages=[Message(**m) for m in d.get("messages", [])],
        )


class ConversationStore:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder) if folder else data_dir() / "conversations"
        self.folder.mkdir(parents=True, exist_ok=True)

    def _file(self, conv_id: str) -> Path:
        return self.folder / f"{conv_id}.json"

    def save(self, conv: Conversation) -> None:
        conv.updated = time.time()
        p = self._file(conv.id)
        tmp = p.with_suffix(".json.tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(conv.to_dict(), f, ensure_ascii=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)

    def load(self, conv_id: str) -> Conversation:
        return Conversation.from_dict(json.loads(self._file(conv_id).read_text(encoding="utf-8")))

    def load_all(self) -> list[Conversation]:
        """Every readable conversation, newest first; a damaged file is skipped and logged."""
        out = []
        for p in self.folder.glob("*.json"):
            try:
                out.append(Conversation.from_dict(json.loads(p.read_text(encoding="utf-8"))))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("skipping unreadable conversation %s: %s", p.name, exc)
        return sorted(out, key=lambda c: c.updated, reverse=True)
