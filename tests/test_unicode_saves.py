"""Any Unicode a chat can hold is saved and read back as it was, lone surrogates included (a server's
JSON "\\ud800" escape or a document's text brings one in): before, one such character made every save
of the chat fail with UnicodeEncodeError."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.conversations import Conversation, ConversationStore, Document, Message

ANY_CHAR = st.one_of(st.characters(), st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"]))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=st.text(ANY_CHAR, max_size=40), doc_text=st.text(ANY_CHAR, max_size=40),
       title=st.text(ANY_CHAR, max_size=10))
def test_any_text_round_trips_through_the_chat_file(tmp_path, answer, doc_text, title):
    store = ConversationStore(tmp_path / "chats")
    conv = Conversation(title=title, documents=[Document(name="d.txt", text=doc_text)],
                        messages=[Message("user", "q"), Message("assistant", answer, check={"shown_answer": answer})])
    store.save(conv)
    back = store.load(conv.id)
    assert (back.title, back.documents[0].text, back.messages[1].content) == (title, doc_text, answer)
    assert back.messages[1].check == {"shown_answer": answer}
