"""Writes backend/data/calibration/: real technical texts from this Debian machine's packages, each cut to
its first CUT_CHARS characters (the capture reads each text's first 1,024 tokens; a licence is kept whole,
as its own terms ask), for the maps'
calibration beside the prose corpus. `python -m lab.experiments.calibration_texts` (Debian 12 with the
packages below); the folder's README records each source and licence. None of these is a document of
the long set or the real-question sets (backend/data/questions)."""
import gzip
import os
import subprocess
from pathlib import Path

CUT_CHARS = 12_000
OUT = Path(__file__).resolve().parents[2] / "backend" / "data" / "calibration"

# (file name, how to get the text): "man:PAGE" renders a man page to plain text, else a path (gunzipped).
SOURCES = (
    ("man-tar.txt", "man:tar"),
    ("man-ssh.txt", "man:ssh"),
    ("man-curl.txt", "man:curl"),
    ("man-journalctl.txt", "man:journalctl"),
    ("man-ps.txt", "man:ps"),
    ("man-make.txt", "man:make"),
    ("md-systemd-environment.txt", "/usr/share/doc/systemd/ENVIRONMENT.md.gz"),
    ("md-systemd-coding-style.txt", "/usr/share/doc/systemd/CODING_STYLE.md.gz"),
    ("md-systemd-uids-gids.txt", "/usr/share/doc/systemd/UIDS-GIDS.md.gz"),
    ("spec-dpkg-rootless-builds.txt", "/usr/share/doc/dpkg/spec/rootless-builds.txt"),
    ("licence-artistic.txt", "/usr/share/common-licenses/Artistic"),
    ("licence-mpl-1.1.txt", "/usr/share/common-licenses/MPL-1.1"),
    ("code-python-shlex.txt", "/usr/lib/python3.11/shlex.py"),
    ("code-zlib-h.txt", "/usr/include/zlib.h"),
    ("table-services.txt", "/etc/services"),
)


def text_of(source: str) -> str:
    if source.startswith("man:"):
        env = {**os.environ, "MANWIDTH": "80", "MAN_KEEP_FORMATTING": "0"}
        raw = subprocess.run(["man", "-P", "cat", source[4:]], env=env, capture_output=True, check=True).stdout
        return subprocess.run(["col", "-bx"], input=raw, capture_output=True, check=True).stdout.decode("utf-8")
    data = Path(source).read_bytes()
    return (gzip.decompress(data) if source.endswith(".gz") else data).decode("utf-8")


def cut(text: str) -> str:
    """The first CUT_CHARS characters, ending at a line's end."""
    if len(text) <= CUT_CHARS:
        return text
    return text[: text.rfind("\n", 0, CUT_CHARS) + 1]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, source in SOURCES:
        text = text_of(source)
        (OUT / name).write_text(text if name.startswith("licence-") else cut(text), encoding="utf-8")
        print(name, len((OUT / name).read_text(encoding="utf-8")))


if __name__ == "__main__":
    main()
