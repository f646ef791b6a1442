"""Makes what the GPU check carries to a machine with no package registry, in `.gpu_carry/` (git-ignored):
llama-cpp-python's sdist without what a build never reads (vendor/llama.cpp's models, docs, web UI, git
history: 76 MB down to a few), and the wheels of the pure-Python packages that machine lacks.

  python packaging/gpu_check/make_carry.py [--sdist llama_cpp_python-0.3.36.tar.gz] [--python-version 3.12]

Without --sdist it runs `pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36` itself.
Prints each file's size and the total, which must fit beside the tracked tree in the device tool's 64 MiB.
"""
from __future__ import annotations

import argparse
import io
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CARRY = ROOT / ".gpu_carry"
LLAMA = "llama-cpp-python==0.3.36"
TRIMMED = "llama_cpp_python-0.3.36-trimmed.tar.gz"
# Inside the sdist's vendor/llama.cpp: never read by a build with tools, tests and examples off.
DROP = ("/.git/", "/.github/", "vendor/llama.cpp/models/", "vendor/llama.cpp/docs/", "vendor/llama.cpp/benches/",
        "vendor/llama.cpp/media/", "vendor/llama.cpp/tools/ui/",
        "vendor/llama.cpp/tests/snapshots/", "examples/notebooks/", "vendor/llama.cpp/scripts/snapdragon/")
# What the check imports that the device image ('cuda', Python 3.12; the device tool's KINDS.md lists
# its packages) lacks: gguf (the K/V weights, the tiny model), diskcache (llama_cpp imports it),
# platformdirs (backend.user_paths). numpy, torch, safetensors, jinja2, filelock, pyyaml, tqdm,
# scikit-build-core, pathspec and packaging are there.
WHEELS = ("gguf==0.19.0", "diskcache==5.6.3", "platformdirs==4.14.8")


def keep(name: str) -> bool:
    return not any(part in name for part in DROP)


def trim(sdist: Path, out: Path) -> tuple[int, int]:
    """Copies `sdist` to `out` without the DROP paths; (members kept, members dropped)."""
    kept = dropped = 0
    with tarfile.open(sdist, "r:gz") as src, tarfile.open(out, "w:gz", compresslevel=9) as dst:
        for member in src:
            if not keep(member.name):
                dropped += 1
                continue
            data = src.extractfile(member) if member.isfile() else None
            dst.addfile(member, io.BytesIO(data.read()) if data else None)
            kept += 1
    return kept, dropped


def download_sdist(folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                    LLAMA, "-d", str(folder)], check=True)
    return next(folder.glob("llama_cpp_python-*.tar.gz"))


def download_wheels(folder: Path, python_version: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                    "--python-version", python_version, "--implementation", "py", "-d", str(folder), *WHEELS],
                   check=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, help="llama-cpp-python 0.3.36's sdist, as pip downloads it")
    ap.add_argument("--python-version", default="3.12", help="the device's Python (its image: 3.12)")
    args = ap.parse_args(argv)
    CARRY.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = args.sdist or download_sdist(Path(tmp))
        kept, dropped = trim(sdist, CARRY / TRIMMED)
        print(f"{sdist.name}: {sdist.stat().st_size / 2**20:.1f} MiB, {dropped} members dropped, {kept} kept")
    download_wheels(CARRY / "wheels", args.python_version)
    total = 0
    for path in sorted(CARRY.rglob("*")):
        if path.is_file():
            total += path.stat().st_size
            print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path.relative_to(ROOT)}")
    print(f"{total / 2**20:8.2f} MiB  in all (carry: .gpu_carry)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
