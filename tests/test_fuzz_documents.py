"""Fuzzing the document readers: whatever bytes a file of any accepted suffix holds (random, a real file with
bytes changed, cut or inserted, or an archive with one damaged part inside), reading it gives text or a
DocumentError, never another exception, and in bounded time. The strategies and the long run (100,000
inputs, docs/HARDENING.md): tests/fuzz_documents.py."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backend.documents import read_document
from fuzz_documents import SUFFIXES, document_bytes, fuzz_documents, read_fuzzed, seed_files


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    return seed_files(tmp_path_factory.mktemp("seeds"))


@pytest.mark.parametrize("suffix", SUFFIXES)
@settings(max_examples=20, deadline=30_000, database=None,  # a hang, not a GC pause on a loaded machine
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_bytes_read_as_text_or_refused_with_a_document_error(seeds, tmp_path_factory, suffix, data):
    raw = data.draw(document_bytes(seeds[suffix], suffix), label="bytes")
    assert read_fuzzed(raw, tmp_path_factory.getbasetemp() / f"fuzzed{suffix}") in ("text", "refused")


@pytest.mark.parametrize("suffix", SUFFIXES)
@settings(max_examples=10, deadline=30_000, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), stop_after=st.integers(0, 6))
def test_reading_told_to_stop_gives_text_a_document_error_or_cancelled(seeds, tmp_path_factory, suffix, data,
                                                                       stop_after):
    raw = data.draw(st.one_of(st.just(seeds[suffix]), document_bytes(seeds[suffix], suffix)), label="bytes")
    path = tmp_path_factory.getbasetemp() / f"stopped{suffix}"
    assert read_fuzzed(raw, path, stop_after) in ("text", "refused", "stopped")


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_every_seed_reads_before_it_is_damaged(seeds, tmp_path, suffix):
    (tmp_path / f"seed{suffix}").write_bytes(seeds[suffix])
    assert "500 requests" in read_document(tmp_path / f"seed{suffix}")


def test_the_long_run_entry_point_counts_inputs_and_findings():
    figures = fuzz_documents(39, seed=3)  # three a suffix
    assert figures["inputs"] == 39 and figures["findings"] == {}, figures["examples"]
    assert figures["outcomes"].get("refused", 0) > 3 and figures["peak_rss_mb"] > 0
