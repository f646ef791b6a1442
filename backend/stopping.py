"""Where an answer ends before its token limit: at a stop string, or when it loops.

A loop is the same sentence (or line) for the third time in one answer: a small model at temperature 0
can say one sentence until the token limit. Sentences end at . ! ? followed by a space, or at a line
break; they are compared lower-cased with their spacing and leading list marks dropped, and only those
of at least LOOP_MIN_WORDS words count (a code block's "}" lines are not a loop).
"""
from __future__ import annotations

import re
from collections import Counter

LOOP_REPEATS = 3  # "the same sentence three times"
LOOP_MIN_WORDS = 3
LOOP_NOTE = "stopped: the answer said the same sentence three times"

_BOUNDARY = re.compile(r"(?<=[.!?])\s+|\n+")
_LEAD = re.compile(r"^[\W\d_]+")  # list marks, numbering, quotes before the first word
_WORD = re.compile(r"\w+")


def sentence_key(sentence: str) -> str:
    """What two sentences share when they are 'the same' ("" for one too short to count)."""
    s = _LEAD.sub("", " ".join(sentence.lower().split()))
    return s if len(_WORD.findall(s)) >= LOOP_MIN_WORDS else ""


class LoopWatch:
    """Fed the answer piece by piece; says when a sentence has come LOOP_REPEATS times."""

    def __init__(self):
        self._open = ""  # the sentence still being written
        self.seen: Counter = Counter()

    def feed(self, piece: str) -> bool:
        self._open += piece
        looped = False
        while (m := _BOUNDARY.search(self._open)) is not None:
            key = sentence_key(self._open[: m.start()])
            self._open = self._open[m.end():]
            if key:
                self.seen[key] += 1
                looped = looped or self.seen[key] >= LOOP_REPEATS
        return looped


class AnswerEnd:
    """The stop strings of a request and, when asked, the loop watch. `feed` each piece of the answer;
    a reason ("stop" or "loop") once the answer is over, and `text`: the answer, cut before a stop string."""

    def __init__(self, stop: list[str] | tuple[str, ...] = (), *, stop_loops: bool = False):
        self.stop = [s for s in stop if s]
        self._loops = LoopWatch() if stop_loops else None
        self.text = ""

    def feed(self, piece: str) -> str | None:
        start = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += piece
        cuts = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if cuts:
            self.text = self.text[: min(cuts)]
            return "stop"
        if self._loops is not None and self._loops.feed(piece):
            return "loop"
        return None
