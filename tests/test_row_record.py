"""The row record (backend/row_record.py): the prefix a request may reuse, rows made exact again, and the
split streams, kept per row for the split that computed them and gone with the rows."""
import numpy as np

from backend.row_record import RowRecord


def _record(n: int) -> RowRecord:
    rows = RowRecord()
    rows.append(list(range(n)), tag="s12")
    return rows


def _mixed() -> RowRecord:
    """Rows 0-3 exact, 4-5 approximated under "s12", 6-7 exact (decoded after the approximated rows)."""
    rows = RowRecord()
    rows.append([0, 1, 2, 3])
    rows.append([4, 5], tag="s12")
    rows.append([6, 7])
    return rows


# ---- prefix reuse -----------------------------------------------------------------------------------------

def test_an_exact_request_reuses_only_the_clean_prefix():
    rows = _mixed()
    assert rows.reusable_prefix(list(range(10))) == 4  # rows 6, 7 are exact but saw approximated rows
    assert rows.all_exact is False and rows.approximated() == [4, 5]


def test_a_ridgefill_request_reuses_rows_written_under_its_own_tag():
    rows = _mixed()
    assert rows.reusable_prefix(list(range(10)), accept_tag="s12") == 8
    assert rows.reusable_prefix(list(range(10)), accept_tag="s9") == 4  # another split's rows are not its own


def test_reuse_stops_at_the_first_other_token():
    rows = _mixed()
    assert rows.reusable_prefix([0, 1, 99, 3, 4], accept_tag="s12") == 2


def test_at_least_one_token_is_left_to_decode():
    rows = RowRecord()
    rows.append([0, 1, 2, 3])
    assert rows.reusable_prefix([0, 1, 2, 3]) == 3
    assert rows.reusable_prefix([0]) == 0
    assert rows.reusable_prefix([]) == 0


# ---- rows made exact again --------------------------------------------------------------------------------

def test_rows_made_exact_to_the_end_make_the_prefix_clean():
    rows = RowRecord()
    rows.append([0, 1, 2, 3])
    rows.append([4, 5, 6, 7], tag="s12")
    rows.mark_exact(4, 8, cells=[40, 41, 42, 43])
    assert rows.all_exact and rows.reusable_prefix(list(range(10))) == 8
    assert rows.approximated() == [] and rows.cells([4, 7]) == [40, 43]


def test_rows_made_exact_stay_unclean_where_later_rows_saw_the_old_ones():
    rows = _mixed()
    rows.mark_exact(4, 6)
    assert rows.approximated() == []  # every row is exact now ...
    assert rows.all_exact is False and rows.reusable_prefix(list(range(10))) == 4  # ... rows 6, 7 saw 4, 5 approximated


def test_rows_made_exact_after_a_gap_leave_the_clean_prefix_as_it_was():
    rows = RowRecord()
    rows.append([0, 1])
    rows.append([2, 3, 4, 5], tag="s12")
    rows.mark_exact(4, 6)  # rows 2, 3 are still approximated
    assert rows.approximated() == [2, 3] and rows.reusable_prefix(list(range(10))) == 2 and not rows.all_exact


def test_a_truncated_record_is_clean_up_to_where_it_was():
    rows = _mixed()
    rows.truncate(3)
    rows.append([3, 4])
    assert rows.all_exact and rows.tokens == [0, 1, 2, 3, 4] and rows.reusable_prefix(list(range(10))) == 5


def test_cells_are_known_only_where_recorded():
    rows = _record(6)
    rows.record_cells(2, np.array([12, 13]))
    assert rows.with_cells() == [2, 3] and rows.cells([2, 3]) == [12, 13]
    rows.mark_exact(2, 3)  # decoded again where the caller does not know the cell
    assert rows.with_cells() == [3]


# ---- split streams ----------------------------------------------------------------------------------------

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
