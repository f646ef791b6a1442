"""`python -m lab fuzz-readers [--examples N] [--reader NAME]`: Hypothesis (a test extra) feeds hostile and damaged
files to the GGUF walk, a map manifest, settings, conversations, the user's model list, a tuned split's record and
an installed model's record (lab/commands/fuzz_checks.py): a clean result or the reader's documented error, else a
finding, printed with its input. tests/test_fuzz_readers.py runs it briefly."""
from __future__ import annotations

import json
import math
import resource
import struct
import tempfile
import time
from pathlib import Path

from lab.commands.fuzz_checks import CHECKS, TUNED_MODEL
from lab.fuzz_report import add_options, hypothesis_missing, report
from lab.fuzz_run import INPUT_S, run_inputs

GGUF_TYPES = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
              "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "u64": (10, "<Q"), "i64": (11, "<q"),
              "f64": (12, "<d")}
STRING, ARRAY = 8, 9
EDGES = [0, 1, 2, 3, 4, 5, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


# --- GGUF bytes ---------------------------------------------------------------------------------

def gguf_string(text: bytes, claimed: int | None = None) -> bytes:
    """A GGUF string; `claimed` writes a length that lies about the bytes that follow."""
    return struct.pack("<Q", len(text) if claimed is None else claimed) + text


def gguf_bytes(kvs: list[tuple[bytes, int, bytes]], tensors: list[bytes] = (), version: int = 3,
               n_kv: int | None = None, n_tensors: int | None = None, tail: bytes = b"") -> bytes:
    """A little-endian GGUF: (encoded key, value type, encoded value) pairs, encoded tensor entries; counts may lie."""
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)
    return head + b"".join(k + struct.pack("<I", t) + v for k, t, v in kvs) + b"".join(tensors) + tail


def nested_array(depth: int) -> bytes:
    """An array of arrays `depth` deep around one empty uint8 array (the encoded value, type ARRAY)."""
    return struct.pack("<IQ", ARRAY, 1) * (depth - 1) + struct.pack("<IQ", 0, 0)


def model_kvs(arch: bytes = b"llama", **numbers) -> list[tuple[bytes, int, bytes]]:
    """The keys read_model_header needs, each number a (type name, value) pair or a plain int (u32)."""
    kvs = [(gguf_string(b"general.architecture"), STRING, gguf_string(arch))]
    for key in ("block_count", "embedding_length", "attention.head_count", "context_length"):
        kind, value = numbers.get(key.replace(".", "_"), ("u32", 4))
        kvs.append((gguf_string(arch + b"." + key.encode()), GGUF_TYPES[kind][0],
                    struct.pack(GGUF_TYPES[kind][1], value)))
    return kvs


def tensor_entry(name: bytes, dims: list[int], ggml_type: int = 0, offset: int = 0) -> bytes:
    return gguf_string(name) + struct.pack(f"<I{len(dims)}QIQ", len(dims), *dims, ggml_type, offset)


def seed_ggufs(folder: Path) -> list[bytes]:
    """Small real GGUF files by the gguf package (as tests/tiny_gguf.py): little- and big-endian, nested arrays."""
    import gguf
    import numpy as np

    out = []
    for i, endian in enumerate((gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG, gguf.GGUFEndian.LITTLE)):
        path = folder / f"seed{i}.gguf"
        w = gguf.GGUFWriter(str(path), "llama", endianess=endian)
        w.add_name("fuzz seed")
        for add, value in ((w.add_block_count, 2), (w.add_embedding_length, 32), (w.add_head_count, 4),
                           (w.add_head_count_kv, 2), (w.add_context_length, 256), (w.add_key_length, 8)):
            add(value)
        w.add_float32("general.sampling.temp", 0.7)
        w.add_int32("general.sampling.top_k", 40)
        w.add_token_list([f"t{j}" for j in range(12)])
        w.add_token_scores([float(-j) for j in range(12)])
        w.add_chat_template("{{ messages }}")
        if i == 2:
            w.add_array("fuzz.nested", [[1, 2], [3]])
            w.add_tensor("small.int8", np.arange(64, dtype=np.int8).reshape(2, 32))
        w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
        w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float16))
        for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file, w.close):
            step()
        out.append(path.read_bytes())
    return out


# --- inputs (Hypothesis strategies) ---------------------------------------------------------------

def strategies(seeds: list[bytes]) -> dict:
    """reader name -> the strategy of its inputs (bytes of the file)."""
    from hypothesis import strategies as st

    numbers = st.one_of(st.sampled_from(EDGES), st.integers(0, 2**64 - 1))

    @st.composite
    def string_value(draw):
        return gguf_string(draw(st.binary(max_size=40)), draw(st.none() | numbers))

    @st.composite
    def kv(draw):
        key = draw(string_value())
        kind = draw(st.sampled_from(sorted(GGUF_TYPES)) | st.just("string") | st.just("array") | st.just("nested")
                    | st.just("odd"))
        if kind == "string":
            return key, STRING, draw(string_value())
        if kind == "array":
            etype = draw(st.sampled_from([0, 6, STRING, ARRAY, 13, 2**32 - 1]))
            return key, ARRAY, struct.pack("<IQ", etype, draw(numbers)) + draw(st.binary(max_size=64))
        if kind == "nested":
            return key, ARRAY, nested_array(draw(st.integers(1, 3000)))
        if kind == "odd":
            return key, draw(st.integers(13, 2**32 - 1)), draw(st.binary(max_size=16))
        size = struct.calcsize(GGUF_TYPES[kind][1])  # any bit pattern: NaN, infinities, negative counts
        return key, GGUF_TYPES[kind][0], draw(st.binary(min_size=size, max_size=size))

    @st.composite
    def model_number(draw):
        kind = draw(st.sampled_from(["u32", "i32", "f32", "f64", "u64"]))
        if kind in ("f32", "f64"):
            return kind, draw(st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 4.0, 1e30]) | st.floats(width=32))
        return kind, draw(st.integers(0, 2**31 - 1) if kind != "u64" else numbers)

    @st.composite
    def random_gguf(draw):
        kvs = draw(st.lists(kv(), max_size=6))
        if draw(st.booleans()):
            kvs = model_kvs(**{k: draw(model_number()) for k in draw(st.sets(st.sampled_from(
                ["block_count", "embedding_length", "attention_head_count", "context_length"])))}) + kvs
        tensors = [tensor_entry(draw(st.binary(max_size=12)), draw(st.lists(numbers, max_size=6)),
                                draw(st.sampled_from([0, 1, 8, 24, 2**31])), draw(numbers))
                   for _ in range(draw(st.integers(0, 3)))]
        if draw(st.booleans()):  # a tensor table entry whose n_dims lies
            tensors.append(gguf_string(b"t") + struct.pack("<I", draw(numbers) % 2**32) + draw(st.binary(max_size=64)))
        return gguf_bytes(kvs, tensors, version=draw(st.sampled_from([2, 3]) | st.integers(0, 2**32 - 1)),
                          n_kv=draw(st.none() | numbers), n_tensors=draw(st.none() | numbers),
                          tail=draw(st.binary(max_size=128)))

    @st.composite
    def mutated_gguf(draw):
        data = bytearray(draw(st.sampled_from(seeds)))
        for _ in range(draw(st.integers(1, 6))):
            at = draw(st.integers(0, len(data)))
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "u64", "u32", "f32"]))
            if op == "flip" and at < len(data):
                data[at] ^= 1 << draw(st.integers(0, 7))
            elif op == "insert":
                data[at:at] = draw(st.binary(min_size=1, max_size=16))
            elif op == "delete":
                del data[at:at + draw(st.integers(1, 16))]
            elif op == "truncate":
                del data[at:]
            elif op in ("u64", "u32"):
                data[at:at + (8 if op == "u64" else 4)] = struct.pack(
                    "<Q" if op == "u64" else "<I", draw(numbers) % (2**64 if op == "u64" else 2**32))
            elif op == "f32":
                data[at:at + 4] = struct.pack("<f", draw(st.sampled_from([math.nan, math.inf, -math.inf, -1.0])))
        return bytes(data)

    return {"gguf": st.one_of(random_gguf(), mutated_gguf()), **json_strategies(st)}


def json_strategies(st) -> dict:
    """Any JSON (NaN, deep nesting), the right shape with wrong values, not JSON, not UTF-8."""
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    def containers(c):  # a named function: Hypothesis reads a lambda's source to see that it recurses
        return st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4)

    anything = st.recursive(scalars, containers, max_leaves=20)
    deep = st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n)
    raw = st.binary(max_size=200).map(lambda b: b.decode("latin-1")) | deep

    def shaped(template: dict):
        keys = st.sampled_from(sorted(template))
        return st.builds(lambda base, changes, drop: {**{k: v for k, v in base.items() if k not in drop}, **changes},
                         st.just(template), st.dictionaries(keys | st.text(max_size=8), anything, max_size=4),
                         st.sets(keys, max_size=3))

    def inputs(template: dict):
        return st.one_of(shaped(template).map(json.dumps), anything.map(json.dumps), raw,
                         st.binary(max_size=64).map(lambda b: b"\xff" + b))

    message = {"role": "user", "content": "hi", "complete": True, "timings": None, "exact": None, "note": ""}
    conversation = {"id": "abc123", "title": "t", "created": 1.0, "updated": 2.0,
                    "document": {"name": "d", "text": "x"}, "messages": [message]}
    entry = {"id": "user-model", "name": "m", "architecture": "llama", "repo_id": "o/r", "filename": "m.gguf",
             "size_bytes": 5, "context_length": 512, "size_exact": False}
    user_models = st.one_of(inputs({"models": [entry]}), st.lists(shaped(entry), max_size=3).map(
        lambda ms: json.dumps({"models": ms})))
    return {"manifest": inputs(MANIFEST_TEMPLATE), "settings": inputs({"threads": 2, "n_ctx": 512, "hub_token": "t",
                                                                       "generation": {}, "ridgefill_on": True}),
            "conversation": inputs(conversation) | st.builds(lambda m: json.dumps({**conversation, "messages": [m]}),
                                                             shaped(message)),
            "catalogue": user_models, "tuned": inputs(_tuned_template()),
            "installed": inputs({"filename": "m.gguf", "size_bytes": 5, "installed_at": "2026-12-05T00:00:00Z"})}


def _tuned_template() -> dict:
    """A tuned record as `tune` writes it for TUNED_MODEL (backend/ridgefill/tuned.py)."""
    from backend.ridgefill.tuned import RECORD_VERSION, model_key

    docs = [{"document": "a.txt", "n": 4, "dnll": 0.01, "q8_abs": 0.02, "ratio": 0.5, "within": True}]
    chosen = {"setting": "speed:12", "mode": "speed", "split": 12, "keeps": True, "ratio": 1.4, "documents": docs}
    return {"record_version": RECORD_VERSION, "model_key": model_key(TUNED_MODEL), "split": 12, "mode": "speed",
            "candidates": [chosen], "chosen_by": "fidelity"}


MANIFEST_TEMPLATE = {"format": "ridgefill-maps", "format_version": 1, "split": 2, "n_layer": 4, "d_in": 8, "d_out": 8,
                     "map_dtype": "float16", "int8_block": 128, "layers": [3], "fingerprint": {},
                     "files": {"layer_003.safetensors": "0" * 64}}


# --- the run --------------------------------------------------------------------------------------

def run_reader(name: str, examples: int, seeds: list[bytes], seed: int = 0, minutes: float = 0,
               input_s: float = INPUT_S, batch: int = 1, progress_s: float = 0) -> dict:
    """`examples` inputs to one reader (lab/fuzz_run.run_inputs: a finding, a Hang too, is counted, never a stop)."""
    return run_inputs(name, strategies(seeds)[name], CHECKS[name], examples, seed, minutes, input_s, batch,
                      progress_s)


def register(sub) -> None:
    p = sub.add_parser("fuzz-readers", help="fuzz every file reader with hostile and damaged files (needs hypothesis)")
    add_options(p, 1000, "inputs per reader")
    p.add_argument("--reader", action="append", choices=sorted(CHECKS), help="only this reader (repeatable)")
    p.add_argument("--memory-gb", type=float, default=4, help="heap cap: past it, a MemoryError finding (default 4)")
    p.add_argument("--batch", type=int, default=8, help="inputs per Hypothesis example (default 8: a third faster)")
    p.add_argument("--progress-minutes", type=float, default=0, help="print the count this often (default: never)")
    p.set_defaults(func=run)


def run(args) -> int:
    """Exit 0 when no reader raised anything but its documented errors (a hang: over INPUT_S s of CPU)."""
    import logging

    if hypothesis_missing("fuzz-readers"):
        return 2
    logging.disable(logging.WARNING)  # every set-aside file logs a warning: thousands of lines otherwise
    resource.setrlimit(resource.RLIMIT_DATA, (int(args.memory_gb * 2**30), resource.getrlimit(resource.RLIMIT_DATA)[1]))
    with tempfile.TemporaryDirectory() as tmp:
        seeds = seed_ggufs(Path(tmp))
    findings = 0
    for name in args.reader or list(CHECKS):
        started = time.perf_counter()
        stats = run_reader(name, args.examples, seeds, args.seed, args.minutes, batch=max(1, args.batch),
                           progress_s=args.progress_minutes * 60)
        findings += report(name, stats, time.perf_counter() - started, args.seed)
    return 1 if findings else 0
