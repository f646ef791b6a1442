"""RidgeFill where the tensors live (issue 66): a tensor off the host (a GPU's) is read and written through
ggml's backend API (ggml_backend_tensor_get / _set), one call per run of consecutive cache rows. Forced on
the CPU build (ggml_graph.FORCE_BACKEND_API), that path gives bit-identical streams, cell indices and K/V
to the host path's numpy views, and the host path never calls the API."""
from __future__ import annotations

import numpy as np
import pytest

from backend.corpus import corpus_texts
from backend.ridgefill import ggml_graph
from backend.ridgefill.cache_layout import CellTap
from backend.ridgefill.ggml_graph import DeviceRows
from backend.ridgefill.plan import ridgefill_prefill
from backend.ridgefill.runtime import runtime
from backend.ridgefill.stream_capture import capture_streams


class FakeNode:
    """A tensor's bytes in a numpy buffer, and the calls made to copy them."""

    def __init__(self, n_rows: int, width: int):
        self.mem = np.arange(n_rows * width, dtype=np.float16).reshape(n_rows, width)
        self.calls: list[tuple[str, int, int]] = []

    def get_into(self, out, offset=0):
        self.calls.append(("get", offset, out.nbytes))
        out[...] = np.frombuffer(self.mem.tobytes()[offset : offset + out.nbytes], out.dtype).reshape(out.shape)
        return out

    def set_from(self, values, offset=0):
        self.calls.append(("set", offset, values.nbytes))
        raw = bytearray(self.mem.tobytes())
        raw[offset : offset + values.nbytes] = values.tobytes()
        self.mem = np.frombuffer(bytes(raw), self.mem.dtype).reshape(self.mem.shape).copy()


def test_device_rows_read_and_write_like_a_numpy_view_one_call_per_run():
    node = FakeNode(16, 4)
    ref = node.mem.copy()
    rows = DeviceRows(node, 16, 8, np.float16)
    cells = np.array([3, 4, 5, 9, 10, 2])
    assert np.array_equal(rows[cells], ref[cells]) and rows.shape == (16, 4)
    assert [c[1] for c in node.calls] == [3 * 8, 9 * 8, 2 * 8]  # three runs, at their rows' bytes
    assert np.array_equal(rows[4], ref[4]) and np.array_equal(rows[2:6], ref[2:6])
    values = np.full((len(cells), 4), 7, np.float16) + np.arange(len(cells), dtype=np.float16)[:, None]
    rows[cells] = values
    ref[cells] = values
    assert np.array_equal(node.mem, ref)
    assert np.array_equal(rows.view(np.uint8)[cells], ref.view(np.uint8)[cells])  # prompt_reuse's bytes
    with pytest.raises(IndexError):
        rows[np.zeros((2, 2), int)]
    node.calls.clear()
    every_other = np.arange(1, 16, 2)[::-1].repeat(2)  # 16 runs of one row within 15 rows: one copy
    assert np.array_equal(rows[every_other], ref[every_other]) and node.calls == [("get", 8, 15 * 8)]


@pytest.fixture
def forced(monkeypatch):
    """Every tensor through ggml's backend API, host ones too; the calls counted."""
    calls = {"get": 0, "set": 0}
    lib = ggml_graph.lib()

    def count(name):
        real = getattr(lib, name)

        def wrapped(*args):
            calls[name.rsplit("_", 1)[1]] += 1
            return real(*args)
        return wrapped

    class Counting:
        ggml_backend_tensor_get = staticmethod(count("ggml_backend_tensor_get"))
        ggml_backend_tensor_set = staticmethod(count("ggml_backend_tensor_set"))

        def __getattr__(self, name):
            return getattr(lib, name)

    monkeypatch.setattr(ggml_graph, "lib", lambda: Counting())
    return lambda on: (monkeypatch.setattr(ggml_graph, "FORCE_BACKEND_API", on), calls)[1]


def _prompt(engine, n: int) -> list[int]:
    return engine.tokenize("\n\n".join(corpus_texts()))[:n]


def test_streams_and_cells_through_the_api_are_the_host_paths(small_engine, forced):
    toks = _prompt(small_engine, 600)
    host_calls = dict(forced(False))
    host = capture_streams(small_engine, [toks], [0, 9, 18])
    assert forced(False) == host_calls  # the host path never asks the API
    api = capture_streams(small_engine, [toks], [0, 9, 18])  # still host: the counting stays 0
    forced(True)
    via = capture_streams(small_engine, [toks], [0, 9, 18])
    assert forced(True)["get"] > 0
    for il in host:
        assert np.array_equal(host[il], api[il]) and np.array_equal(host[il], via[il])
    tap = CellTap(runtime(small_engine).layout)
    small_engine.slot.truncate(0)
    with small_engine.hooked(tap):
        small_engine.slot.decode(toks[:100], 0, logits_last=True)
    assert np.array_equal(tap.first_layer_cells(), np.arange(100))
    small_engine.slot.truncate(0)


def test_cache_rows_through_the_api_are_the_host_view(small_engine, forced):
    small_engine.slot.truncate(0)
    small_engine.slot.decode(_prompt(small_engine, 200), 0, logits_last=True)
    cache = runtime(small_engine).layout.layers[3].k_cache
    cells = np.array([0, 1, 2, 50, 51, 199, 7])
    host = cache.rows()
    assert isinstance(host, np.ndarray)
    want = host[cells].copy()
    forced(True)
    rows = cache.rows()
    assert isinstance(rows, DeviceRows) and np.array_equal(rows[cells], want)
    rows[cells[:3]] = want[3:6]  # written through tensor_set, seen in host memory
    assert np.array_equal(host[cells[:3]], want[3:6])
    small_engine.slot.truncate(0)


def test_a_plumb_prefill_through_the_api_writes_the_same_kv(small_engine, forced):
    toks = _prompt(small_engine, 1800)

    def run():
        small_engine.slot.truncate(0)
        report = ridgefill_prefill(small_engine, toks, "plumb", 18, 512)
        assert report.mode == "plumb", report.note
        return bytes(small_engine.slot.state_bytes()), small_engine.last_logits().copy()

    forced(False)
    host_state, host_logits = run()
    calls = forced(True)
    state, logits = run()
    assert calls["set"] > 0  # the late K/V went through tensor_set
    assert state == host_state and np.array_equal(logits, host_logits)
    small_engine.slot.truncate(0)
