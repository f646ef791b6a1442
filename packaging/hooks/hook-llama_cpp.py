"""PyInstaller hook for llama-cpp-python (there is no upstream one).

llama_cpp loads its shared libraries with ctypes from `<package dir>/lib` (see
llama_cpp/_ctypes_extensions.py), so they must land in `llama_cpp/lib` inside the bundle, under the
names it opens (`libllama.so`, `libggml.so`, ...) and under their SONAMEs (`*.so.0`), which the
libraries' own NEEDED entries and `$ORIGIN` run-path resolve. The fully versioned copies and the
multimodal `libmtmd` are left out: the app never loads them.
"""
from __future__ import annotations

from pathlib import Path

from PyInstaller.utils.hooks import get_package_paths

_, pkg_dir = get_package_paths("llama_cpp")
lib_dir = Path(pkg_dir) / "lib"

# The libraries ctypes opens by name and their SONAME aliases; on Windows/macOS the DLL/dylib names.
_WANTED = ("llama", "ggml", "ggml-base", "ggml-cpu")
binaries = []
for path in sorted(lib_dir.iterdir()) if lib_dir.is_dir() else []:
    name = path.name
    stem = name.split(".")[0]
    if stem.startswith("lib"):
        stem = stem[3:]
    if stem not in _WANTED:
        continue
    # keep libX.so, libX.so.0, libX.dylib, libX.0.dylib, X.dll; skip libX.so.0.25.3 duplicates
    if name.endswith((".so", ".so.0", ".dylib", ".dll")):
        binaries.append((str(path), "llama_cpp/lib"))

# Never used by the app: the OpenAI-compatible server and the multimodal bindings (which would
# also pull in libmtmd).
excludedimports = ["llama_cpp.server", "llama_cpp.mtmd_cpp", "llama_cpp.llava_cpp"]
