"""One conversation as the engine gets it: the turns so far, the documents in the first user turn, and the
request for the next question (with the documents, so the answer comes with its sources). No Qt: the chat tab
(ui/chat_panel.py) shows it and sends what this builds.
"""
from __future__ import annotations

from pathlib import Path

from app.conversations import Conversation, Document, Message
from backend.documents import DocumentText, document_messages
from backend.protocol import DEFAULT_MAX_TOKENS, ChatMessage, CompletionRequest

UNTITLED = Conversation().title  # a conversation keeps this title until its first document or question
TITLE_CHARS = 40  # a title taken from the first question


def history(conv: Conversation, question: str, frame_documents: bool = True) -> list[ChatMessage]:
    """The chat so far plus `question`; the documents go into the first user turn (unless not
    `frame_documents`). Answers that are empty or were cut off are left out, and so is an unanswered user
    turn, so the turns alternate; notes (a document added or removed) are the app's, not the model's."""
    turns = [(m.role, m.content) for m in conv.messages
             if m.role == "user" or (m.role == "assistant" and m.content.strip() and m.complete)]
    clean: list[tuple[str, str]] = []
    for role, content in turns:
        if clean and clean[-1][0] == role == "user":  # the later of two questions in a row (the first failed)
            clean[-1] = (role, content)
        else:
            clean.append((role, content))
    if clean and clean[-1][0] == "user":
        clean.pop()
    clean.append(("user", question))
    msgs = [ChatMessage(r, c) for r, c in clean]
    if conv.documents and frame_documents:
        msgs[0] = document_messages(document_texts(conv), msgs[0].content)[0]
    return msgs


def document_texts(conv: Conversation) -> list[DocumentText]:
    """The conversation's documents as the engine reads them (the sources point into these texts)."""
    return [DocumentText(d.name, d.text, tuple(d.page_starts)) for d in conv.documents]


def build_request(conv: Conversation, question: str, *, mode: str, split: int | None = None,
                  tail: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS, frame_documents: bool = True,
                  **over) -> CompletionRequest:
    """The request that asks `question` next; split and tail only with RidgeFill on. `over` sets any other
    CompletionRequest field (reuse_prefix=False for a compare run). The documents go with it: the answer
    comes with its sources. Not `frame_documents`: the first turn holds no document text and the request says
    so (unframed_documents): the engine child or the remote client frames them in (backend.documents.framed),
    so nothing here copies a large document."""
    on = mode != "off"
    texts = document_texts(conv) or None
    req = CompletionRequest(messages=history(conv, question, frame_documents), max_tokens=max_tokens, mode=mode,
                            split=split if on else None, tail=tail if on else None, documents=texts,
                            unframed_documents=None if frame_documents else texts)
    for k, v in over.items():
        setattr(req, k, v)
    return req


def attach(conv: Conversation, path: str | Path, text: str | DocumentText) -> Document:
    """Add a document the next questions are about, after those attached before; an untitled conversation
    is named after its first. `text` is the text read, or the DocumentText (with a PDF's pages)."""
    read = text if isinstance(text, DocumentText) else DocumentText(Path(path).name, text)
    doc = Document(read.name or Path(path).name, read.text, tuple(read.page_starts), str(path))
    conv.documents.append(doc)
    if conv.title == UNTITLED:
        conv.title = doc.name
    return doc


def remove(conv: Conversation, index: int) -> Document:
    """Take document `index` out of the conversation; the chat says so in a note."""
    doc = conv.documents.pop(index)
    conv.messages.append(Message("note", documents_note(conv, f"Document {doc.name} removed")))
    return doc


def documents_note(conv: Conversation, what: str) -> str:
    """"<what>: the next answer reads N documents" (or "reads no document")."""
    n = len(conv.documents)
    return f"{what}: the next answer reads " + ("no document" if n == 0 else "1 document" if n == 1
                                                 else f"{n} documents")


def ask(conv: Conversation, question: str) -> Message:
    """Record `question` and the answer to come (empty, incomplete); returns that answer's message."""
    conv.messages.append(Message("user", question))
    if conv.title == UNTITLED:
        conv.title = question[:TITLE_CHARS]
    answer = Message("assistant", "", complete=False)
    conv.messages.append(answer)
    return answer


def note_added(conv: Conversation, added: list[Document]) -> Message | None:
    """After documents were added to a chat that has messages: a note that says so (None before any)."""
    if not conv.messages or not added:
        return None
    names = ", ".join(d.name for d in added)
    note = Message("note", documents_note(conv, f"Document{'s' if len(added) > 1 else ''} {names} added"))
    conv.messages.append(note)
    return note


def answer_count(conv: Conversation) -> int:
    return sum(1 for m in conv.messages if m.role == "assistant")


def apply_check(conv: Conversation, check: dict) -> Message | None:
    """Record an engine's check (backend/answer_check.py) on the answer it is for, the latest complete
    RidgeFill answer of `conv` not checked yet, whose text is the one checked; a corrected answer's text
    becomes exact's (RidgeFill's stays in the check). None: the check is for another chat, or came twice."""
    for m in reversed(conv.messages):
        if m.role == "assistant" and m.complete and m.check is None and m.exact is None \
                and (m.timings or {}).get("mode", "off") != "off":
            if m.content != check.get("shown_answer"):
                return None
            m.check = check
            if check.get("verdict") == "corrected" and isinstance(check.get("exact_answer"), str):
                m.content = check["exact_answer"]
            return m
    return None
