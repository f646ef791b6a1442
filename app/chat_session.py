"""One conversation as the engine gets it: the turns so far, the document in the first user turn, and the
request for the next question. No Qt: the chat tab (ui/chat_panel.py) shows it and sends what this builds.
"""
from __future__ import annotations

from pathlib import Path

from app.conversations import Conversation, Document, Message
from backend.documents import document_messages
from backend.protocol import DEFAULT_MAX_TOKENS, ChatMessage, CompletionRequest

UNTITLED = Conversation().title  # a conversation keeps this title until its first document or question
TITLE_CHARS = 40  # a title taken from the first question


def history(conv: Conversation, question: str) -> list[ChatMessage]:
    """The chat so far plus `question`; the document goes into the first user turn. Answers that are
    empty or were cut off are left out, and so is an unanswered user turn, so the turns alternate."""
    turns = [(m.role, m.content) for m in conv.messages if m.role == "user" or (m.content.strip() and m.complete)]
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
    if conv.document is not None:
        msgs[0] = document_messages(conv.document.text, msgs[0].content)[0]
    return msgs


def build_request(conv: Conversation, question: str, *, mode: str, split: int | None = None,
                  tail: int | None = None, max_tokens: int = DEFAULT_MAX_TOKENS, **over) -> CompletionRequest:
    """The request that asks `question` next; split and tail only with RidgeFill on. `over` sets any other
    CompletionRequest field (reuse_prefix=False for a compare run)."""
    on = mode != "off"
    req = CompletionRequest(messages=history(conv, question), max_tokens=max_tokens, mode=mode,
                            split=split if on else None, tail=tail if on else None)
    for k, v in over.items():
        setattr(req, k, v)
    return req


def attach(conv: Conversation, path: str | Path, text: str) -> None:
    """The document the next questions are about; an untitled conversation is named after it."""
    conv.document = Document(Path(path).name, text)
    if conv.title == UNTITLED:
        conv.title = Path(path).name


def ask(conv: Conversation, question: str) -> Message:
    """Record `question` and the answer to come (empty, incomplete); returns that answer's message."""
    conv.messages.append(Message("user", question))
    if conv.title == UNTITLED:
        conv.title = question[:TITLE_CHARS]
    answer = Message("assistant", "", complete=False)
    conv.messages.append(answer)
    return answer


def answer_count(conv: Conversation) -> int:
    return sum(1 for m in conv.messages if m.role == "assistant")
