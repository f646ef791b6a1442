"""Where the OS cannot read files relative to an open folder (Windows), an entry's files are read by path,
with the same refusals: the hardening tests of tests/test_prompt_cache_hardening.py run that way too."""
from __future__ import annotations

import pytest

import backend.entry_folder as entry_folder
import test_prompt_cache_hardening as hardening
from backend.prompt_cache import PromptCache

BY_PATH_TOO = [
    hardening.test_a_synthetic_entry_loads_whole,
    hardening.test_a_fifo_in_an_entry_is_refused_without_waiting,
    hardening.test_a_state_whose_cell_count_is_huge_is_refused_before_any_allocation,
    hardening.test_a_reader_refusing_a_replaced_entry_leaves_the_new_one,
]


@pytest.mark.parametrize("test", BY_PATH_TOO, ids=lambda t: t.__name__)
def test_entries_read_by_path_where_there_is_no_dir_fd(test, tmp_path, monkeypatch):
    monkeypatch.setattr(entry_folder, "BY_DIR_FD", False)
    test(PromptCache(tmp_path / "prompts"))


def test_this_machine_reads_relative_to_the_folder():  # the tests above are the other way, not this one
    assert entry_folder.BY_DIR_FD


def test_a_state_that_says_more_cells_than_its_bytes_hold_is_refused_before_any_allocation():
    import struct

    from backend.seq_state import MARK_BYTES, StateFormatError, read_layout

    blob = bytes(MARK_BYTES) + struct.pack("<II", 1, 2**32 - 1)  # one stream, 4 billion cells, no bytes for them
    with pytest.raises(StateFormatError, match="more than its"):
        read_layout(blob)


def test_an_entry_removed_by_another_process_after_listing_still_prints(tmp_path):
    import shutil

    from fuzz_cache import save_synthetic, synthetic_facts

    cache = PromptCache(tmp_path / "prompts")
    save_synthetic(cache, synthetic_facts(list(range(20))))
    (entry,) = cache.entries()
    shutil.rmtree(entry.folder)  # `cache list` of another process got there first
    assert entry.as_dict()["files"] == [] and entry.as_dict()["tokens"] == 20
