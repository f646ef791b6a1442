"""Where an answer ends before its token limit: at a stop string, or when it loops.

A loop is the same sentence (or list line) for the third time in one answer, or the same run of two to
LOOP_CYCLE_MAX sentences twice in a row ("A B A B"): a small model at temperature 0 can say one sentence
until the token limit, go round a list ("8. Monday"), or alternate two long list items whose numbers
differ ("3. The client receives..." "4. The server then sends..." "5. The client receives...").
Sentences end at . ! ? followed by a space, or at a line break (a list number's dot does not end one);
they are compared lower-cased with their spacing, end marks and leading list marks dropped: numbering
("7.", "**7.**", "(7)", "07:", "Step 7:") is not part of what a list item says. A sentence counts from
LOOP_MIN_WORDS words, a list line from one (a code block's "}" lines, a "Yes." are not a loop).
A heading (a line of its own: "## Costs", "**Monday**", "Risks:") starts a section: a sentence counts
three times within one heading's section ("**Mon** - gym **Tue** - gym **Wed** - gym" is a schedule),
and headings take part in the "A B A B" check, so the same section written again is still a loop.
"""
from __future__ import annotations

import re
from collections import Counter

LOOP_REPEATS = 3  # "the same sentence three times"
LOOP_CYCLE_MAX = 4  # "A B A B" up to "A B C D A B C D": a run of sentences said again right after itself
LOOP_MIN_WORDS = 3
LOOP_NOTE = "stopped: the answer was repeating itself"

_BOUNDARY = re.compile(r"\n+|(?<=[.!?])\s+")
_LIST_NUMBER = re.compile(r"\s*(\d+|[A-Za-z])[.)]")  # "8." at a line's start belongs to its line
_LIST_MARK = re.compile(r"\s*([-*\u2022]|\d+[.):])\s")  # "- ", "8. ", "8) ", "08: "
_LEAD = re.compile(r"^[\W\d_]+")  # list marks, numbering, quotes before the first word
# a numbered item's label: "Step 3:", "item 3.", "Example 3)" (after _LEAD); only with its number
_LABEL = re.compile(r"^(step|item|point|part|example|option|case|note|tip|reason|answer|question)\s+\d+\b[\W_]*")
_WORD = re.compile(r"\w+")
_NUMBER = re.compile(r"\d+")
_HEADING = re.compile(r"#+\s.*|\*\*[^*]+\*\*:?|.*:")  # a line that names what follows it


def sentence_key(sentence: str) -> str:
    """What two sentences share when they are 'the same' ("" for one too short to count). A numbered
    item's number goes, and so does the same number in its text ("4. Send request 4")."""
    s = " ".join(sentence.lower().split())
    numbering = ""
    for mark in (_LEAD, _LABEL):
        m = mark.match(s)
        if m:
            numbering += m.group()
            s = s[m.end():]
    number = _NUMBER.search(numbering)
    if number:
        s = re.sub(rf"\b{number.group()}\b", "#", s)
    s = s.rstrip(".!?;:, ")
    least = 1 if _LIST_MARK.match(sentence) else LOOP_MIN_WORDS
    return s if len(_WORD.findall(s)) >= least else ""


class LoopWatch:
    """Fed the answer piece by piece; says when a sentence has come LOOP_REPEATS times, or a run of
    sentences twice in a row."""

    def __init__(self):
        self._open = ""  # the sentence still being written
        self._line_start = True  # it began a line
        self._heading = ""  # the last heading, as said has it
        self.seen: Counter = Counter()  # (heading, sentence key): how often, in that heading's section
        self.said: list[str] = []  # the sentences that count and the headings, in order, as keys

    def feed(self, piece: str) -> bool:
        self._open += piece
        looped, start = False, 0
        while (m := _BOUNDARY.search(self._open, start)) is not None:
            head, ends_line = self._open[: m.start()], "\n" in m.group()
            if not m.group().startswith("\n") and _LIST_NUMBER.fullmatch(head):
                start = m.end()  # "8. Monday": not a sentence of its own
                continue
            self._open, start = self._open[m.end():], 0
            looped = self._sentence(head, whole_line=self._line_start and ends_line) or looped
            self._line_start = ends_line
        return looped

    def _sentence(self, text: str, whole_line: bool) -> bool:
        if whole_line and _WORD.search(text) and _HEADING.fullmatch(text.strip()):
            self._heading = "# " + " ".join(text.lower().split())
            self.said.append(self._heading)
            return self._cycled()
        key = sentence_key(text)
        if not key:
            return False
        self.seen[self._heading, key] += 1
        self.said.append(key)
        return self.seen[self._heading, key] >= LOOP_REPEATS or self._cycled()

    def _cycled(self) -> bool:
        """The last 2k sentences are k sentences (2 <= k <= LOOP_CYCLE_MAX) said twice in a row."""
        said, n = self.said, len(self.said)
        return any(said[n - 2 * k: n - k] == said[n - k:] for k in range(2, min(LOOP_CYCLE_MAX, n // 2) + 1))


class AnswerEnd:
    """The stop strings of a request and, when asked, the loop watch: the one place an answer is cut at a
    stop string. `feed` each piece of the answer; a reason ("stop" or "loop") once the answer is over, and
    `text`: the answer, cut before a stop string. `shown()`: what of it may be shown now, so a streamed
    answer never shows part of a stop string (text that could start one is held until it cannot).
    `ends`: stop strings that end an answer only once it has begun (a base model's paragraph end, which
    may come before its first word)."""

    def __init__(self, stop: list[str] | tuple[str, ...] = (), *, stop_loops: bool = False,
                 ends: list[str] | tuple[str, ...] = ()):
        self.stop = [s for s in stop if s]
        self.ends = [s for s in ends if s]
        self._loops = LoopWatch() if stop_loops else None
        self.text = ""
        self.over = False
        self._shown = 0  # how much of `text` shown() has given out

    def feed(self, piece: str) -> str | None:
        start = max(0, len(self.text) - max((len(s) for s in self.stop + self.ends), default=0))
        self.text += piece
        cuts = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        cuts += [i for i in (self._begun_end(s, start) for s in self.ends) if i >= 0]
        if cuts:
            self.text, self.over = self.text[: min(cuts)], True
            return "stop"
        if self._loops is not None and self._loops.feed(piece):
            self.over = True
            return "loop"
        return None

    def finish(self, last: str = "") -> str:
        """The answer ended otherwise (its end, the token limit, a cancel): `last` text is its last; what
        shown() had not given out yet."""
        self.feed(last)
        self.over = True
        return self.shown()

    def shown(self) -> str:
        """The answer's text not given out yet that no stop string can still begin in (all of it once over)."""
        end = len(self.text) if self.over else len(self.text) - self._held()
        out, self._shown = self.text[self._shown:end], max(self._shown, end)
        return out

    def _held(self) -> int:
        """The length of the longest end of `text` that a stop string starts with."""
        keep = 0
        for s in self.stop + self.ends:
            for k in range(min(len(s) - 1, len(self.text)), keep, -1):
                if self.text.endswith(s[:k]):
                    keep = k
                    break
        return keep

    def _begun_end(self, end: str, start: int) -> int:
        """Where `end` first comes after the answer's first non-space text (-1: nowhere yet)."""
        begun = len(self.text) - len(self.text.lstrip())
        return self.text.find(end, max(start, begun)) if self.text.strip() else -1
