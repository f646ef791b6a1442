"""Reading documents: text in the encodings people save, and a refusal with a reason for anything else."""
from __future__ import annotations

import random

import pytest

from backend.documents import read_document
from backend.errors import DocumentError, EmptyDocumentError


def test_random_bytes_named_txt_are_refused_with_a_reason(tmp_path):
    doc = tmp_path / "notes.txt"
    doc.write_bytes(random.Random(0).randbytes(3000))
    with pytest.raises(DocumentError) as err:
        read_document(doc)
    message = str(err.value)
    assert "notes.txt does not look like text" in message  # what happened
    assert "plain text (UTF-8) or PDF" in message  # what the user can do


def test_a_binary_file_with_a_text_name_is_refused(tmp_path):
    doc = tmp_path / "report.md"
    doc.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8)
    with pytest.raises(DocumentError, match="does not look like text"):
        read_document(doc)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "cp1252"])
def test_text_in_the_encodings_people_save_is_read(tmp_path, encoding):
    text = "Café “crème” – déjà vu.\nThe passkey is 5820417.\n"
    doc = tmp_path / "memo.txt"
    doc.write_bytes(text.replace("\n", "\r\n").encode(encoding))
    assert read_document(doc) == text  # BOM dropped, line ends as a text-mode read gives them


def test_text_with_a_few_control_characters_is_still_text(tmp_path):
    doc = tmp_path / "build.log"
    doc.write_text("".join(f"\x1b[32mINFO\x1b[0m step {i} finished without trouble\n" for i in range(50)))
    assert "step 49 finished" in read_document(doc)


def test_empty_and_missing_documents_are_refused(tmp_path):
    (tmp_path / "empty.txt").write_text(" \n\n ")
    with pytest.raises(EmptyDocumentError, match="empty"):
        read_document(tmp_path / "empty.txt")
    with pytest.raises(DocumentError, match="not found"):
        read_document(tmp_path / "nope.txt")
