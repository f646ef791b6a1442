"""PyInstaller hook for torch, replacing pyinstaller-hooks-contrib's (user hooks take priority).

The contributed hook collects every torch submodule and every non-Python file in the package: the
C++ headers, CMake files, test binaries (`torch/test`, `torch/bin`) and the compilers' sources.
The app only needs tensor maths on the CPU (ridge maps: matmul and linalg), so this hook collects
what `import torch` loads (found by modulegraph from the import graph), the runtime data files,
and the shared libraries except test-only ones. Compilers, exporters and test suites are excluded
in the spec (packaging/ridgefill.spec, TORCH_EXCLUDES).
"""
from __future__ import annotations

import os

from PyInstaller.utils.hooks import PY_DYLIB_PATTERNS, collect_data_files, collect_dynamic_libs, get_package_paths

# torch reads its own sources at import time (torch.utils._config_module calls inspect.getsource
# on its config modules), so the .py files must ship next to the byte-code, as upstream does.
module_collection_mode = "pyz+py"
warn_on_missing_hiddenimports = False

# Runtime data only: no headers, no C++ sources, no type stubs, no test or tool binaries.
datas = collect_data_files(
    "torch",
    excludes=[
        "**/*.h", "**/*.hpp", "**/*.cuh", "**/*.cpp", "**/*.c", "**/*.cmake", "**/*.pyi", "**/*.lib",
        "**/*.a", "include/**", "share/**", "test/**", "bin/**",
        "_inductor/**", "_dynamo/**", "utils/benchmark/**", "**/*.ptl",
    ],
)

_TORCH_DIR = get_package_paths("torch")[1]
_TEST_LIBS = ("libjitbackend_test", "libtorchbind_test", "libbackend_with_compiler", "libaoti_custom_ops")
binaries = [
    (src, dest)
    for src, dest in collect_dynamic_libs("torch", search_patterns=PY_DYLIB_PATTERNS + ["*.so.*"])
    if not any(t in src for t in _TEST_LIBS)
    and os.path.relpath(src, _TORCH_DIR).split(os.sep)[0] not in ("test", "bin")
]

# `import torch` checks that torch/bin/torch_shm_manager exists (torch/__init__.py, _manager_path), so
# that one helper ships; the rest of torch/bin is test programs and protoc.
# (Not on Windows, where torch has no such helper.)
_shm_manager = os.path.join(_TORCH_DIR, "bin", "torch_shm_manager")
if os.path.isfile(_shm_manager):
    binaries.append((_shm_manager, "torch/bin"))

# See the contributed hook: symlinks from torch/lib to the top level confuse torch's library lookup.
bindepend_symlink_suppression = ["**/torch/lib/*.so*"]
