"""Bombs within the caps (issue 55, item 6): a small .odt whose XML asks its reader for millions of elements is
refused by a pass that builds nothing, in bounded memory; a folder's symbolic links are not followed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from backend.documents import read_documents
from backend.errors import DocumentError
from test_document_formats import write_odt

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 3 << 30  # the child's address space: an unbounded reader dies here instead of taking the machine

# Reads the document in a child with its address space limited; prints what happened and the peak RSS.
READ = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[2]), int(sys.argv[2])))
from backend.documents import read_document
from backend.errors import DocumentError
try:
    read_document(sys.argv[1])
    outcome = "read"
except DocumentError as exc:
    outcome = "refused: " + str(exc)
except MemoryError:
    outcome = "MemoryError"
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"outcome": outcome, "peak_mb": peak_mb}))
"""


def write_odt_bomb(path: Path, elements: int) -> Path:
    """A real .odt whose content.xml holds one paragraph of `elements` <text:s/> (spaces), written streaming."""
    plain = write_odt(path.with_name("plain.odt"))
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if info.filename != "content.xml":
                out.writestr(info, src.read(info))
                continue
            head, tail = src.read(info).decode().split("Second paragraph.")
            with out.open("content.xml", "w") as member:
                member.write(head.encode())
                for _ in range(elements // 100_000):
                    member.write(b"<text:s/>" * 100_000)
                member.write(tail.encode())
    return path


def read_in_child(path: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", READ, str(path), str(MEMORY_LIMIT)], cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.parametrize("elements", [5_000_000, 45_000_000])  # 40 MB: too many elements; 360 MB: too large a part
def test_an_odt_whose_xml_asks_for_millions_of_elements_is_refused_in_bounded_memory(tmp_path, elements):
    bomb = write_odt_bomb(tmp_path / "bomb.odt", elements)
    assert bomb.stat().st_size < 1 << 20
    got = read_in_child(bomb)
    assert got["outcome"].startswith("refused: bomb.odt holds more XML than any document"), got
    assert "save it again" in got["outcome"]
    assert got["peak_mb"] < 2048, got


def test_a_document_of_ordinary_size_is_still_read(tmp_path):
    fine = write_odt_bomb(tmp_path / "long.odt", 200_000)
    assert read_documents([fine])[0].text.count(" ") >= 200_000


def test_a_folder_does_not_follow_a_symbolic_link_out_of_it(tmp_path):
    outside = tmp_path / "private" / "diary.txt"
    outside.parent.mkdir()
    outside.write_text("My bank PIN is 4071.")
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "notes.txt").write_text("The meeting is at noon.")
    (folder / "diary.txt").symlink_to(outside)
    (folder / "inside.txt").symlink_to(folder / "notes.txt")  # a link is never followed, wherever it leads
    docs = read_documents([folder])
    assert [d.name for d in docs] == ["notes.txt"] and "4071" not in "".join(d.text for d in docs)
    (folder / "notes.txt").unlink()
    with pytest.raises(DocumentError, match="symbolic links are not followed"):
        read_documents([folder])
