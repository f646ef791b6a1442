"""The part of a long document the pane lays out at once.

Qt lays out a QPlainTextEdit's whole text on the GUI thread when it is set (one block per line): a 500 MB text
froze the window for minutes and took gigabytes. The pane shows at most WINDOW_CHARS characters of a document,
a part at a time, with its edges moved to a line break when one is near; a source far into the document brings
the part that holds it."""
from __future__ import annotations

WINDOW_CHARS = 400_000  # about 100,000 words: laid out in well under a second on a slow machine
SNAP_CHARS = 2_000  # a part's edge moves back to a line break at most this far
LEAD = 4  # a passage shown is placed a 1/LEAD of the way into its part, so what comes before it shows too


def window_from(text: str, start: int, size: int = WINDOW_CHARS) -> tuple[int, int]:
    """The part [lo, hi) of `text` that starts at `start` (or ends at the text's end), at most `size` long."""
    n = len(text)
    if n <= size:
        return 0, n
    lo = max(0, min(int(start), n - size))
    if lo > 0 and (cut := text.rfind("\n", max(0, lo - SNAP_CHARS), lo)) >= 0:
        lo = cut + 1
    hi = min(n, lo + size)
    if hi < n and (cut := text.rfind("\n", max(lo, hi - SNAP_CHARS), hi)) > lo:
        hi = cut + 1
    return lo, hi


def window_before(text: str, end: int, size: int = WINDOW_CHARS) -> tuple[int, int]:
    """The part that ends where the part starting at `end` begins (the one before it)."""
    return window_from(text, max(0, end - size + SNAP_CHARS), size)


def window_around(text: str, start: int, end: int, size: int = WINDOW_CHARS) -> tuple[int, int]:
    """A part holding the passage [start, end) a quarter of the way in (its beginning, if it is longer)."""
    room = max(0, size - (end - start))
    return window_from(text, max(0, start - min(room // 2, size // LEAD)), size)


def holds(window: tuple[int, int], start: int, end: int) -> bool:
    return window[0] <= start and end <= window[1]
