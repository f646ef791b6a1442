import pytest

from backend.errors import ModelFileError
from backend.model_file import read_model_header, read_model_info
from tests.tiny_gguf import write_tiny_gguf


def test_embedded_model_facts(model_path):
    info = read_model_info(model_path)
    assert (info.architecture, info.n_layer, info.n_embd, info.n_head, info.n_head_kv) == ("llama", 30, 576, 9, 3)
    assert info.n_ctx_train == 8192
    assert "im_start" in info.chat_template


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="not found"):
        read_model_info(tmp_path / "nope.gguf")


def test_not_a_gguf(tmp_path):
    p = tmp_path / "notes.gguf"
    p.write_text("hello, I am text")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        read_model_info(p)


def test_directory_is_refused(tmp_path):
    with pytest.raises(ModelFileError, match="Not a file"):
        read_model_info(tmp_path)


@pytest.mark.parametrize("keep", [64, 2_000_000, 90_000_000])
def test_truncated_gguf_is_refused(model_path, tmp_path, keep):
    p = tmp_path / "cut.gguf"
    with open(model_path, "rb") as f:
        p.write_bytes(f.read(keep))
    with pytest.raises(ModelFileError, match="damaged or truncated|lacks|no general"):
        read_model_info(p)


def test_header_read_gives_the_same_model_info_as_the_full_reader(tmp_path, model_path):
    paths = [model_path] + [str(write_tiny_gguf(tmp_path / f"{a}.gguf", a)) for a in ("qwen2", "gemma3")]
    for p in paths:
        assert read_model_header(p) == read_model_info(p)


def test_the_sliding_window_is_read_from_the_header(tmp_path, model_path):
    gemma = write_tiny_gguf(tmp_path / "gemma3.gguf", "gemma3", sliding_window=48)
    assert read_model_header(gemma).sliding_window == read_model_info(gemma).sliding_window == 48
    assert read_model_header(model_path).sliding_window == 0  # llama: every layer sees everything


def test_the_header_walk_reads_what_ggufs_own_reader_reads(model_path):
    """open_reader walks the header itself (gguf's reader takes seconds on a large vocabulary); what it
    gives must be what gguf's reader gives: values, each pair's bytes, the tensor table and its data."""
    from pathlib import Path

    import numpy as np

    from backend.model_file import GGUFArray, _from_gguf_reader, open_reader

    fast, slow = open_reader(Path(model_path)), _from_gguf_reader(Path(model_path))
    meta = {k: v for k, v in slow.values.items() if not k.startswith("GGUF.")}  # gguf's header pseudo-fields
    assert fast.values.keys() == meta.keys() and fast.spans == {k: slow.spans[k] for k in meta}
    for k, v in meta.items():
        assert (len(fast.values[k]), type(fast.values[k])) == (len(v), GGUFArray) if isinstance(v, GGUFArray) \
            else fast.values[k] == v, k
    assert [(t.name, t.tensor_type, list(t.shape), t.n_bytes, t.data_offset, t.data.shape) for t in fast.tensors] == \
        [(t.name, t.tensor_type, list(t.shape), t.n_bytes, t.data_offset, t.data.shape) for t in slow.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(fast.tensors[:12], slow.tensors[:12]))
