"""Fuzzing the document readers: whatever bytes a file of any accepted suffix holds (random, a real file with
bytes changed, cut or inserted, or an archive with one damaged part inside), reading it gives text or a
DocumentError, never another exception, and in bounded time."""
from __future__ import annotations

import io
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.documents import DOCUMENT_SUFFIXES, read_document
from backend.errors import DocumentError
from tests.test_document_formats import FACT, write_docx, write_epub, write_odt, write_pdf

SUFFIXES = sorted(set(DOCUMENT_SUFFIXES) | {".log"})  # and one the app reads as text by default
ARCHIVES = {".docx", ".epub", ".odt"}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    """A real, readable file for every suffix: the fuzzer damages these."""
    folder = tmp_path_factory.mktemp("seeds")
    html = f"<html><head><style>p {{}}</style></head><body><h1>Manual</h1><p>{FACT}</p></body></html>"
    made = {
        ".pdf": write_pdf(folder / "a.pdf", ["First page.", FACT]),
        ".docx": write_docx(folder / "a.docx"),
        ".epub": write_epub(folder / "a.epub", {"one": "<p>It begins.</p>", "two": f"<p>{FACT}</p>"}),
        ".odt": write_odt(folder / "a.odt"),
    }
    found = {suffix: path.read_bytes() for suffix, path in made.items()}
    return {suffix: found.get(suffix, (html if "htm" in suffix else FACT * 20).encode()) for suffix in SUFFIXES}


@st.composite
def damaged(draw, seed: bytes) -> bytes:
    """The seed with a few bytes replaced, runs cut out, or bytes inserted."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        kind = draw(st.sampled_from(["replace", "cut", "insert"]))
        if kind == "replace" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "cut":
            del data[at:at + draw(st.integers(1, 64))]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


@st.composite
def damaged_inside(draw, seed: bytes) -> bytes:
    """A sound zip archive whose one part (a document's XML, its manifest) is damaged: what reaches the parsers."""
    with zipfile.ZipFile(io.BytesIO(seed)) as original:
        parts = {info.filename: original.read(info) for info in original.infolist()}
    name = draw(st.sampled_from(sorted(parts)))
    parts[name] = draw(damaged(parts[name]))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for member, data in parts.items():
            archive.writestr(member, data)
    return out.getvalue()


@pytest.mark.parametrize("suffix", SUFFIXES)
@settings(max_examples=20, deadline=3000, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_read_as_text_or_refused_with_a_document_error(seeds, tmp_path_factory, suffix, data):
    seed = seeds[suffix]
    strategies = [st.binary(max_size=3000), damaged(seed)] + ([damaged_inside(seed)] if suffix in ARCHIVES else [])
    raw = data.draw(st.one_of(strategies), label="bytes")
    path = tmp_path_factory.getbasetemp() / f"fuzzed{suffix}"
    path.write_bytes(raw)
    try:
        text = read_document(path)
    except DocumentError as exc:
        assert str(exc) and "\n" not in str(exc)  # one line that says what happened
    else:
        assert isinstance(text, str) and text.strip()


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_seed_reads_before_it_is_damaged(seeds, tmp_path, suffix):
    (tmp_path / f"seed{suffix}").write_bytes(seeds[suffix])
    assert "500 requests" in read_document(tmp_path / f"seed{suffix}")
