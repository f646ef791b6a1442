"""The row record's split streams: kept per row for the split that computed them, gone with the rows."""
import numpy as np

from backend.row_record import RowRecord


def _record(n: int) -> RowRecord:
    rows = RowRecord()
    rows.append(list(range(n)), tag="s12")
    return rows


def test_split_streams_are_given_only_for_kept_rows_of_the_same_split():
    rows = _record(10)
    h = np.arange(40, dtype=np.float32).reshape(4, 10)
    rows.keep_split_streams(12, 3, h)
    np.testing.assert_array_equal(rows.split_streams(12, [5, 3]), h[[2, 0]])
    assert rows.split_streams(12, [2, 3]) is None  # row 2 has none
    assert rows.split_streams(12, [6, 7]) is None  # past the kept rows
    assert rows.split_streams(9, [3]) is None  # another split
    rows.keep_split_streams(12, 8, h[:2])  # a later bulk pass (a follow-up), after a gap
    np.testing.assert_array_equal(rows.split_streams(12, [4, 9]), np.stack([h[1], h[1]]))
    rows.keep_split_streams(9, 0, h[:1])  # another split replaces them all
    assert rows.split_streams(12, [3]) is None and rows.split_streams(9, [0]) is not None


def test_truncated_rows_lose_their_streams():
    rows = _record(10)
    rows.keep_split_streams(12, 0, np.ones((10, 4), dtype=np.float32))
    rows.truncate(6)
    rows.append([1, 2, 3, 4], tag="s12")  # other rows at the same positions
    assert rows.split_streams(12, [5]) is not None and rows.split_streams(12, [6]) is None
