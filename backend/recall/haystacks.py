"""Haystacks for needle items: the repeated-sentence filler, the shipped prose corpus, or a user's text file.

A haystack is long text that is cycled as often as a prompt needs; needles go in at sentence ends.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from ..corpus import corpus_texts
from ..documents import read_document
from ..errors import DocumentError

# RULER's NIAH filler: repetitive, so a needle is the only thing in it worth remembering.
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
BUILTIN = ("filler", "corpus", "ledger")

# The number-dense haystack: council minutes where every sentence names a place and gives figures,
# so a needle's number competes with hundreds of others (RidgeFill's hardest case: the maps blur which
# number belongs to which name).
_PLACES = ("Millbrook Ashford Kestrel Hollow Brackenside Fernleigh Oakridge Saltmarsh Thornbury Wexcombe "
           "Harrowgate Linton Pennywell Quarry Ravensmoor Stonegate Tidewater Upperton Westfold Yarrowby "
           "Cobble Dunmere Eldergrove Foxton Greywater Hillcrest Ivybridge Juniper Knoll Larkspur").split()
_WORKS = ("footbridge repairs", "library roof", "sluice replacement", "bus shelter", "school kitchen",
          "harbour wall", "street lighting", "allotment fencing", "drainage survey", "play area",
          "bowling green", "chapel clock", "ferry slipway", "cycle path", "market canopy")


def ledger_text(n_items: int = 400, seed: int = 7) -> str:
    import random

    rng = random.Random(seed)
    out = []
    for i in range(1, n_items + 1):
        place, work = rng.choice(_PLACES), rng.choice(_WORKS)
        out.append(
            f"Item {i}. For the {place} {work} the council approved {rng.randint(10, 99)},{rng.randint(0, 999):03d} "
            f"pounds, with {rng.randint(3, 11)} votes for and {rng.randint(0, 4)} against; work starts in week "
            f"{rng.randint(1, 52)} and the contract runs {rng.randint(2, 36)} months."
        )
    return " ".join(out)


@dataclass(frozen=True)
class Haystack:
    name: str  # "filler", "corpus", or "<file stem>-<content hash>" (part of every item id)
    text: str


def filler_haystack() -> Haystack:
    return Haystack("filler", " ".join([FILLER] * 50))


def corpus_haystack() -> Haystack:
    texts = [t.strip() for t in corpus_texts() if t.strip()]
    if not texts:
        raise DocumentError("The shipped prose corpus is missing; reinstall the app or give --haystack FILE.")
    return Haystack("corpus", "\n\n".join(texts))


def file_haystack(path: str | Path) -> Haystack:
    """Any text (or PDF) file the user gives. Its name carries a content hash, so results of two
    different files with one name never mix in a resumed run."""
    text = read_document(path)  # DocumentError / EmptyDocumentError with a clear message
    if sum(ch.isalpha() for ch in text) < 200:
        raise DocumentError(f"{Path(path).name} has too little text to hide a needle in; give a longer file.")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
    return Haystack(f"{Path(path).stem}-{digest}", text.strip())


def load_haystack(spec: str | Path | None) -> Haystack:
    """'filler' (default), 'corpus', 'ledger' (number-dense minutes), or a path to a text file."""
    if spec is None or str(spec) == "filler":
        return filler_haystack()
    if str(spec) == "corpus":
        return corpus_haystack()
    if str(spec) == "ledger":
        return Haystack("ledger", ledger_text())
    return file_haystack(spec)
