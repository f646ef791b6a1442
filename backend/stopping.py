"""Where an answer ends before its token limit: at a stop string, or when it loops.

A loop is the same sentence (or list line) for the third time in one answer: a small model at
temperature 0 can say one sentence until the token limit, or go round a list ("8. Monday"). Sentences
end at . ! ? followed by a space, or at a line break (a list number's dot does not end one); they are
compared lower-cased with their spacing, leading list marks and end marks dropped. A sentence counts from
LOOP_MIN_WORDS words, a list line from one (a code block's "}" lines, a "Yes." are not a loop).
"""
from __future__ import annotations

import re
from collections import Counter

LOOP_REPEATS = 3  # "the same sentence three times"
LOOP_MIN_WORDS = 3
LOOP_NOTE = "stopped: the answer said the same sentence three times"

_BOUNDARY = re.compile(r"\n+|(?<=[.!?])\s+")
_LIST_NUMBER = re.compile(r"\s*(\d+|[A-Za-z])[.)]")  # "8." at a line's start belongs to its line
_LIST_MARK = re.compile(r"\s*([-*\u2022]|\d+[.)])\s")
_LEAD = re.compile(r"^[\W\d_]+")  # list marks, numbering, quotes before the first word
_WORD = re.compile(r"\w+")


def sentence_key(sentence: str) -> str:
    """What two sentences share when they are 'the same' ("" for one too short to count)."""
    s = _LEAD.sub("", " ".join(sentence.lower().split())).rstrip(".!?;:, ")
    least = 1 if _LIST_MARK.match(sentence) else LOOP_MIN_WORDS
    return s if len(_WORD.findall(s)) >= least else ""


class LoopWatch:
    """Fed the answer piece by piece; says when a sentence has come LOOP_REPEATS times."""

    def __init__(self):
        self._open = ""  # the sentence still being written
        self.seen: Counter = Counter()

    def feed(self, piece: str) -> bool:
        self._open += piece
        looped, start = False, 0
        while (m := _BOUNDARY.search(self._open, start)) is not None:
            head = self._open[: m.start()]
            if not m.group().startswith("\n") and _LIST_NUMBER.fullmatch(head):
                start = m.end()  # "8. Monday": not a sentence of its own
                continue
            self._open, start = self._open[m.end():], 0
            key = sentence_key(head)
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
