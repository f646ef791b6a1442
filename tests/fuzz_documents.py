"""Fuzz the document readers (backend/documents.read_document): for every accepted suffix, random bytes, a
real file with bytes replaced, cut or inserted, and (for the zip formats) a sound archive with one damaged
part. Reading must give text or a one-line DocumentError; anything else, or more than INPUT_S seconds of CPU
on one input, is a finding. tests/test_fuzz_documents.py runs 20 inputs a suffix with these strategies.

Long run: `python -m tests.fuzz_documents 100000 [SEED]`: the inputs spread evenly over the suffixes,
printing inputs, outcomes, findings (with an example each), the slowest input and peak RSS.
"""
from __future__ import annotations

import io
import json
import resource
import signal
import sys
import tempfile
import time
import traceback
import zipfile
from collections import Counter
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings
from hypothesis import strategies as st

from backend.documents import DOCUMENT_SUFFIXES, read_document
from backend.errors import Cancelled, DocumentError

SUFFIXES = sorted(set(DOCUMENT_SUFFIXES) | {".log"})  # and one the app reads as text by default
ARCHIVES = {".docx", ".epub", ".odt"}
INPUT_S = 10  # CPU seconds one input may take before it counts as a hang
MEMORY_GB = 4  # the heap cap of a long run: past it a MemoryError is a finding, not the machine's memory


def seed_files(folder: Path) -> dict[str, bytes]:
    """A real, readable file for every suffix: the fuzzer damages these."""
    from tests.test_document_formats import FACT, write_docx, write_epub, write_odt, write_pdf

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


# Pieces of markup that parsers treat specially: a web page or an archive's part made of them reaches the element
# count and the HTML and XML parsers behind it
MARKUP = [b"<p>", b"<b>", b"</b>", b"<b/>", b"<!--", b"-->", b"<![CDATA[", b"]]>", b"<?xml version='1.0'?>",
          b"<!DOCTYPE x [<!ENTITY a 'aa'>]>", b"&a;", b"&#0;", b"<script>", b"</script>", b"<a href='x'>", b"\xef\xbb\xbf",
          b"\x00<\x00", b"<html>", b"<body>", b"x", b" ", b"\xff\xfe"]


@st.composite
def markup(draw) -> bytes:
    return b"".join(draw(st.lists(st.sampled_from(MARKUP), max_size=200)))


@st.composite
def renamed_inside(draw, seed: bytes) -> bytes:
    """A sound zip archive whose one part is renamed (everywhere the others name it: the element count goes by
    what a part holds, not its name) and maybe replaced by markup."""
    with zipfile.ZipFile(io.BytesIO(seed)) as original:
        parts = {info.filename: original.read(info) for info in original.infolist()}
    old = draw(st.sampled_from(sorted(parts)))
    new = draw(st.text("abcxyz/._", min_size=1, max_size=12))
    data = draw(st.one_of(st.just(parts.pop(old)), markup()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for member, content in parts.items():
            archive.writestr(member, content.replace(old.encode(), new.encode()))
        archive.writestr(new, data)
    return out.getvalue()


def document_bytes(seed: bytes, suffix: str):
    """The strategy for one suffix's files."""
    inside = [damaged_inside(seed), renamed_inside(seed)] if suffix in ARCHIVES else []
    return st.one_of([st.binary(max_size=3000), damaged(seed), markup()] + inside)


def read_fuzzed(raw: bytes, path: Path, stop_after: int | None = None) -> str:
    """Write `raw` at `path` and read it: "text" or "refused" (or "stopped", when the reading is told to stop at
    its `stop_after`-th question); anything else raises (a finding)."""
    path.write_bytes(raw)
    asked = []
    try:
        text = read_document(path, None if stop_after is None else lambda: asked.append(1) or len(asked) > stop_after)
    except DocumentError as exc:
        assert str(exc) and "\n" not in str(exc), f"not a one-line message: {exc!r}"
        return "refused"
    except Cancelled:
        assert stop_after is not None and len(asked) == stop_after + 1, "stopped unasked, or went on after True"
        return "stopped"
    assert isinstance(text, str) and text.strip(), "read, but no text"
    return "text"


class Hang(Exception):
    """An input past INPUT_S seconds of CPU (raised inside the reader by SIGPROF)."""


def _hang(signum, frame):
    raise Hang("still running after its time limit")


def fuzz_documents(n: int, seed: int = 0) -> dict:
    """About `n` inputs, spread evenly over SUFFIXES; the figures."""
    outcomes, findings, examples = Counter(), Counter(), {}
    slowest = [0.0, ""]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        seeds = seed_files(folder)
        previous = signal.signal(signal.SIGPROF, _hang)
        try:
            for suffix in SUFFIXES:
                _fuzz_suffix(suffix, seeds[suffix], -(-n // len(SUFFIXES)), seed, folder / f"fuzzed{suffix}",
                             outcomes, findings, examples, slowest)
                print(f"  {suffix}: {sum(outcomes.values()):,} inputs so far, {sum(findings.values())} findings, "
                      f"peak RSS {_peak_rss_mb():,.0f} MB", flush=True)
        finally:
            signal.signal(signal.SIGPROF, previous)
    return {"inputs": sum(outcomes.values()), "outcomes": dict(outcomes), "findings": dict(findings),
            "examples": examples, "slowest_ms": round(slowest[0] * 1000), "slowest_suffix": slowest[1],
            "peak_rss_mb": round(_peak_rss_mb())}


def _fuzz_suffix(suffix, seed_bytes, count, seed, path, outcomes, findings, examples, slowest) -> None:
    @hseed(seed)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(document_bytes(seed_bytes, suffix))
    def one(raw: bytes) -> None:
        started = time.process_time()
        try:
            signal.setitimer(signal.ITIMER_PROF, INPUT_S)
            outcome = read_fuzzed(raw, path)
        except Exception as exc:  # a finding: counted with an example, the run goes on
            outcome = "finding"
            key = f"{suffix} {type(exc).__name__} at {_where(exc)}"
            findings[key] += 1
            examples.setdefault(key, (str(exc)[:200], repr(raw[:300])))
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
        outcomes[outcome] += 1
        if time.process_time() - started > slowest[0]:
            slowest[:] = [time.process_time() - started, suffix]

    one()


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/backend/" in f.filename]
    return f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_GB * 2**30, resource.getrlimit(resource.RLIMIT_DATA)[1]))
    started_at = time.monotonic()
    figures = fuzz_documents(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000,
                             int(sys.argv[2]) if len(sys.argv) > 2 else 0)
    figures["seconds"] = round(time.monotonic() - started_at)
    print(json.dumps(figures, indent=1))
    sys.exit(1 if figures["findings"] else 0)
