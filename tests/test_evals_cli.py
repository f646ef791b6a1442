"""The eval commands (`python -m lab`) and the NLL / sweep runners on the real model (short documents, few items)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.recall.haystacks import filler_haystack
from backend.recall.needles import build_item
from lab.evals.nll import nll_documents, run_nll
from lab.evals.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]


def lab(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "lab", "--threads", "2", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def _line(i, mode, correct, region="bulk", depth=0.1):
    return json.dumps({"kind": "recall", "id": f"filler-single-L2048-D{depth}-r{i}-s0", "mode": mode,
                       "split": None if mode == "off" else 18, "tail": 512, "length": 2048, "depth": depth,
                       "variant": "single", "region": region, "correct": correct, "reply": "x"})


def test_compare_one_file_and_two_files(tmp_path):
    both = tmp_path / "both.jsonl"
    both.write_text("\n".join([_line(i, "off", True) for i in range(8)] + [_line(i, "speed", i > 5) for i in range(8)]
                              + ['{"kind": "nll", "id": "d", "mode": "off", "nll": 1.0}']) + "\n")
    out = lab("compare", str(both)).stdout
    assert "speed S18 T512" in out and "McNemar p = 0.031" in out  # 6 discordant one way: 2 / 2**6
    data = json.loads(lab("compare", str(both), "--json").stdout)
    assert data["comparisons"][0]["overall"]["a_only"] == 6 and data["accuracy"]["off"]["overall"]["n"] == 8

    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(_line(i, "off", True) for i in range(4)) + "\n")
    b.write_text("\n".join(_line(i, "speed", True) for i in range(4)) + "\n")
    out = lab("compare", str(a), str(b)).stdout
    assert "paired items: 4" in out and "McNemar p = 1.000" in out

    bad = lab("compare", str(tmp_path / "missing.jsonl"), check=False)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    bad = lab("compare", str(both), str(b), "--a", "speed S99 T1", check=False)
    assert bad.returncode == 2 and "no condition" in bad.stderr


def test_recall_command_writes_lines_and_resumes(tmp_path):
    out = tmp_path / "r.jsonl"
    run1 = lab("recall", "--lengths", "200", "--depths", "0.5", "--modes", "off", "--tail", "64", "--out", str(out))
    assert "[1/1]" in run1.stderr and "overall" in run1.stdout
    rec = json.loads(out.read_text().splitlines()[0])
    assert rec["length"] == 200 and rec["variant"] == "single" and rec["region"] in ("bulk", "tail")
    run2 = lab("recall", "--lengths", "200", "--depths", "0.5", "--modes", "off", "--tail", "64", "--out", str(out),
               "--json")
    assert "[1/1]" not in run2.stderr  # nothing ran again
    assert json.loads(run2.stdout)["accuracy"]["off"]["overall"]["n"] == 1
    bad = lab("recall", "--lengths", "200", "--variants", "sideways", "--out", str(out), check=False)
    assert bad.returncode == 2 and "unknown variant" in bad.stderr


def test_nll_documents_are_exact_length_and_skip_the_calibrated_start(small_engine):
    docs = nll_documents(small_engine, 700, 3)
    bos = small_engine.tokenize("", add_special=True)
    assert [len(d.tokens) for d in docs] == [700] * 3 and all(d.tokens[: len(bos)] == bos for d in docs)
    assert len({d.id for d in docs}) == 3
    from backend.corpus import corpus_texts

    start = small_engine.tokenize(corpus_texts()[0].strip(), add_special=False)[:40]
    assert docs[0].tokens[len(bos): len(bos) + 40] != start


def test_nll_pairs_documents_and_a_refused_mode_changes_nothing(small_engine, tmp_path):
    docs = nll_documents(small_engine, 640, 2)
    out = tmp_path / "n.jsonl"
    # 640 tokens are far too short to approximate: "speed" runs exact and says so, so ΔNLL is exactly 0
    s = run_nll(small_engine, docs, "speed", 18, 512, out, last_n=64)
    assert s["n_docs"] == 2 and s["approximated"] == 0 and s["notes"]
    assert s["delta"] == 0.0 and s["ci_lo"] == 0.0 == s["ci_hi"]
    assert 0.5 < s["nll_off"] < 8.0  # nats per token of real prose
    assert len(out.read_text().splitlines()) == 4
    again = run_nll(small_engine, docs, "speed", 18, 512, out, last_n=64)  # resumed: nothing reruns
    assert again["delta"] == 0.0 and len(out.read_text().splitlines()) == 4


def test_sweep_rows_have_the_ratio_accuracy_and_nll(small_engine, tmp_path):
    from lab.commands.sweep import sweep_text

    hay = filler_haystack()
    item = build_item(small_engine, length=200, depth=0.2, variant="single", haystack=hay)
    r = run_sweep(small_engine, splits=[18], tail=64, ttft_item=item, items=[item], docs=[], out_path=tmp_path / "s.jsonl")
    row = r["rows"][0]
    assert row["split"] == 18 and row["mode_run"] == "off"  # too short for RidgeFill: exact
    # every row ran exact, so the needle is labelled tail and the bulk holds no item
    assert row["ttft_ratio"] > 0 and row["bulk_items"] == 0 and row["bulk_acc"] is None
    assert (row["maps"] == "found" or row["maps"].startswith("missing")) and row["dnll"] is None
    text = sweep_text(r)
    assert "speed-up" in text and "0/0" in text
    # without a TTFT prompt the ratio comes from the needle items' own runs (all resumed here: no rerun)
    lines = len((tmp_path / "s.jsonl").read_text().splitlines())
    r2 = run_sweep(small_engine, splits=[18], tail=64, ttft_item=None, items=[item], docs=[], out_path=tmp_path / "s.jsonl")
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == lines
    assert r2["rows"][0]["ttft_ratio"] > 0 and not r2["ttft_paired"] and "not back to back" in sweep_text(r2)
