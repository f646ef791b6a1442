"""Stop reaches a reading in progress: the chat's reader asks `stopped()` inside each document's reading
(backend/doc_budget.py), not only between files, so a long web page stops midway."""
from __future__ import annotations

import pytest

from backend.errors import Cancelled
from ui.chat_documents import read_each


def test_a_stop_during_one_documents_reading_ends_it(tmp_path):
    page = tmp_path / "long.html"
    page.write_text("<html><body>" + "<p>a line of the page</p>" * 200_000 + "</body></html>", encoding="utf-8")
    asked = []

    def stopped() -> bool:
        asked.append(1)
        return len(asked) > 1  # the check before the file passes; the first one inside the reading stops it

    with pytest.raises(Cancelled):
        read_each([page], stopped)
    assert len(asked) >= 2
    found, errors = read_each([page])  # unstopped, the same page reads whole
    assert errors == [] and "a line of the page" in found[0][1].text
