"""The prose corpus shipped with the app (backend/data/corpus, CC0, written for this project)."""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path


def corpus_dir() -> Path:
    return Path(str(files("backend").joinpath("data", "corpus")))


def corpus_files() -> list[Path]:
    return sorted(corpus_dir().glob("*.txt"))


def corpus_texts() -> list[str]:
    return [p.read_text(encoding="utf-8") for p in corpus_files()]
