"""Opening a chat and listing the chats without the GUI thread waiting on a disk (issue 65): these run on the
conversation store's writer thread (ConversationStore.later), after the writes handed to it before, and tell
what they read through `tell`, a plain callable that queues it for the GUI thread (ui/chat_loading.py).

Qt-free, and what they tell is plain data: the writer thread must never hold a Qt object.
"""
from __future__ import annotations

import logging
from typing import Callable, Sequence

from app.conversations import Conversation, ConversationStore

log = logging.getLogger(__name__)

Tell = Callable[[tuple], None]


def open_chat(store: ConversationStore, conv_ids: Sequence[str], tell: Tell) -> None:
    """The first of `conv_ids` whose chat file reads, told as ("chat", conversation) with the texts of the
    documents kept in side files left empty (the chat file is small: it shows at once), then those texts as
    ("texts", [text or None per document: None for one the chat file held inline]). ("failed", message)
    when no chat could be read, or a side file could not."""
    conv, why = None, "no chat was asked for"
    for conv_id in conv_ids:
        try:
            conv = store.read(conv_id, read_text=lambda _text_file: "")
            break
        except (OSError, ValueError) as exc:  # the next one, as the window's start always did
            why = f"the chat {conv_id} could not be read ({exc})"
    if conv is None:
        return tell(("failed", why))
    tell(("chat", conv))
    try:
        texts = [store.read_text(d.text_file) if d.text_file else None for d in conv.documents]
    except (OSError, ValueError) as exc:
        return tell(("failed", f"a document of the chat {conv.title!r} could not be read ({exc})"))
    tell(("texts", texts))


def list_chats(store: ConversationStore, tell: Tell) -> None:
    """Each readable chat's Summary, newest first, told as ("summaries", [...])."""
    tell(("summaries", store.read_summaries()))


def guarded(job: Callable[[Tell], None], tell: Tell) -> Callable[[], None]:
    """`job(tell)` for the writer thread: an unexpected error is told as ("failed", message), so the window
    never waits for news that cannot come."""
    def run() -> None:
        try:
            job(tell)
        except Exception as exc:  # noqa: BLE001 - a bug in a read: logged, and the window hears of it
            log.exception("reading the chats failed")
            tell(("failed", f"reading the chats failed ({exc})"))
    return run


def fill_texts(conv: Conversation, texts: Sequence[str | None]) -> None:
    """Put the texts open_chat read into `conv`'s documents (None: the text it held already)."""
    for doc, text in zip(conv.documents, texts):
        if text is not None:
            doc.text = text
