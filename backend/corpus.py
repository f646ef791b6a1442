"""The prose corpus shipped with the app (backend/data/corpus, CC0, written for this project), and the
calibration text: that corpus and real technical texts (backend/data/calibration, their licences in its README)."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def corpus_dir() -> Path:
    return Path(str(files("backend").joinpath("data", "corpus")))


def corpus_files() -> list[Path]:
    return sorted(corpus_dir().glob("*.txt"))


def calibration_files() -> list[Path]:
    """The maps' calibration text: the prose corpus, then the real technical texts of
    backend/data/calibration (man pages, Markdown, a specification, licences, code, a table)."""
    return corpus_files() + sorted(Path(str(files("backend").joinpath("data", "calibration"))).glob("*.txt"))


def corpus_texts() -> list[str]:
    return [p.read_text(encoding="utf-8") for p in corpus_files()]
