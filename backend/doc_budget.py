"""What reading one document may spend, and whether the user stopped it.

A ReadBudget goes with a document through its reader: every XML or HTML text a reader parses is first streamed
through a parser target that counts its elements and builds nothing (so the count is taken where the parsing is,
whatever the part's name), against one element budget for the whole document; between members, pages, chunks
and every few thousand elements the reader asks `check()`, which raises Cancelled once the caller's `cancelled()`
says so and DocumentError once the document has taken longer than MAX_READ_SECONDS.
"""
from __future__ import annotations

import time
from typing import Callable, Iterable

from .errors import Cancelled, DocumentError

# The XML inside a .docx, .epub or .odt, and a web page, become a tree of objects in their reader (python-docx and
# lxml, odfpy, inscriptis): odfpy takes about 600 bytes an element (3 million: 1.8 GB), inscriptis about 400. A
# document whose XML and HTML hold more elements and attributes in all is refused by the counting pass, so reading
# any document stays under 2 GB (docs/HARDENING.md#xml-bombs-within-the-caps).
MAX_XML_ELEMENTS = 2_000_000
# The largest XML part or web page chapter: a book's chapter is some 100 KB, a whole spec on one page some 15 MB.
MAX_XML_MEMBER_BYTES = 64 * 1024 * 1024
# Reading one document may take this long: a 10,000-page PDF takes 2-4 minutes on a slow 2-core machine, the largest
# .odt the element cap lets through about one; past it the file is doing work no document needs.
MAX_READ_SECONDS = 10 * 60
CHECK_EVERY = 20_000  # elements between two checks of the cancel flag and the clock: well under 0.1 s of parsing
_PARSER_OPTIONS = {"resolve_entities": False, "no_network": True}  # a document may not fetch or expand


def never() -> bool:
    return False


class TooMuchXML(DocumentError):
    """More elements, or a larger XML part, than any document needs (the caller's message says which file)."""


class ReadBudget:
    """The elements and the time one document's reading may still spend, and the caller's cancel flag."""

    def __init__(self, name: str, cancelled: Callable[[], bool] | None = None):
        self.name = name
        self.cancelled = cancelled or never
        self.elements_left = MAX_XML_ELEMENTS
        self.deadline = time.monotonic() + MAX_READ_SECONDS

    def check(self) -> None:
        """Cancelled when the caller asked to stop; DocumentError when the document took too long."""
        if self.cancelled():
            raise Cancelled(f"stopped reading {self.name}")
        if time.monotonic() > self.deadline:
            took = f"{MAX_READ_SECONDS // 60} minutes" if MAX_READ_SECONDS >= 60 else f"{MAX_READ_SECONDS} seconds"
            raise DocumentError(f"{self.name} took more than {took} to read: it asks far "
                                "more work than any document needs and is refused as damaged or hostile. Open it "
                                "in the program that made it and export it as PDF or plain text, or split it.")

    def refused(self) -> TooMuchXML:
        return TooMuchXML(f"{self.name} holds more XML than any document of its size needs (over "
                          f"{MAX_XML_ELEMENTS:,} elements, or one part over {MAX_XML_MEMBER_BYTES >> 20} MB): it is "
                          "refused as damaged or hostile. Open it in the program that made it and save it again, "
                          "or export it as PDF or plain text.")

    def spend(self, elements: int) -> None:
        self.elements_left -= elements
        if self.elements_left < 0:
            raise self.refused()

    def count_xml(self, chunks: Iterable[bytes]) -> None:
        """Count the elements of one XML part (bytes, in chunks); a part lxml cannot parse counts each "<"."""
        from lxml import etree

        kept = self.elements_left
        parser = etree.XMLParser(target=_Counter(self), recover=True, huge_tree=False, **_PARSER_OPTIONS)
        seen = []  # the chunks fed, to count them again when lxml gives up; each at most 1 MB, and bounded below
        try:
            for chunk in self._bounded(chunks):
                seen.append(chunk)
                parser.feed(chunk)
            parser.close()
        except etree.LxmlError:  # not XML to lxml (an empty part, damaged bytes): each "<" counts, an upper bound
            self.elements_left = kept
            for chunk in seen:
                self.spend(chunk.count(b"<"))
            for chunk in self._bounded(chunks):
                self.spend(chunk.count(b"<"))

    def count_html(self, text: str) -> None:
        """Count the elements lxml's HTML parser (inscriptis reads with it) finds in a web page's text."""
        from lxml import etree

        if len(text) > MAX_XML_MEMBER_BYTES:
            raise self.refused()
        parser = etree.HTMLParser(target=_Counter(self), huge_tree=False, no_network=True)
        for start in range(0, len(text), 1 << 20):
            self.check()
            parser.feed(text[start:start + (1 << 20)])
        parser.close()

    def _bounded(self, chunks: Iterable[bytes]) -> Iterable[bytes]:
        size = 0
        for chunk in chunks:
            self.check()
            size += len(chunk)
            if size > MAX_XML_MEMBER_BYTES:
                raise self.refused()
            yield chunk


class _Counter:
    """An lxml parser target: spends one element (and one per attribute) of the budget each, builds nothing."""

    def __init__(self, budget: ReadBudget):
        self.budget = budget
        self.until_check = CHECK_EVERY

    def start(self, tag, attrib) -> None:
        self.budget.spend(1 + len(attrib))
        self.until_check -= 1
        if self.until_check <= 0:
            self.until_check = CHECK_EVERY
            self.budget.check()

    def close(self) -> None:
        return None


def looks_like_xml(head: bytes) -> bool:
    """Whether a part starting with `head` could be parsed as XML by libxml2 or expat (whatever its name): after a
    byte-order mark and white space its first character is "<", in UTF-8, UTF-16 or UTF-32 (their zero bytes
    dropped), or EBCDIC's "<?xm"."""
    for bom in (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"):
        head = head.removeprefix(bom)
    return head.replace(b"\x00", b"").lstrip(b" \t\r\n").startswith(b"<") or head.startswith(b"\x4c\x6f\xa7\x94")
