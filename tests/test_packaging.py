"""Packaging: the Linux bundle built from a clean clone passes its self-test, and so does the
launcher of its .deb unpacked into a scratch root. Plus quick checks of the pieces (icon, runtime
hook, desktop entry) that need no build.

The build test is slow (PyInstaller over torch: minutes; two self-tests: a minute or more each).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: no venv, no source tree on the path, a scratch home."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.pop("QT_QPA_PLATFORM", None)  # --selftest must go headless by itself
    env.pop("RIDGEFILL_EMBEDDED_MODEL", None)  # the bundle must find its own copy
    env["RIDGEFILL_HOME"] = str(home)
    return env


# ---- quick checks ------------------------------------------------------------------------------
def test_icon_is_drawn_at_every_size(tmp_path):
    from PySide6.QtGui import QImage

    r = subprocess.run([sys.executable, "packaging/make_icon.py", str(tmp_path)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for size in (16, 48, 256, 512):
        img = QImage(str(tmp_path / f"ridgefill-{size}.png"))
        assert (img.width(), img.height()) == (size, size)
        assert img.pixelColor(size // 2, size // 2).alpha() == 255  # drawn, not blank
        assert img.pixelColor(0, 0).alpha() == 0  # rounded corner stays transparent


def test_runtime_hook_gives_missing_streams_a_file_and_finds_the_model(tmp_path):
    """A windowed build starts with sys.stdout/sys.stderr = None: after the hook, print() and
    writes to stderr land in the user log dir instead of raising."""
    models = tmp_path / "bundle" / "models"
    models.mkdir(parents=True)
    (models / "m.gguf").write_bytes(b"GGUF")
    code = (
        "import os, runpy, sys\n"
        f"sys._MEIPASS = {str(tmp_path / 'bundle')!r}\n"
        "sys.stdout = None; sys.stderr = None\n"
        "runpy.run_path('packaging/rthooks/rthook_ridgefill.py')\n"
        "print('to stdout'); sys.stderr.write('to stderr\\n'); sys.stderr.flush()\n"
        "open(os.environ['RIDGEFILL_HOME'] + '/model.txt', 'w').write(os.environ['RIDGEFILL_EMBEDDED_MODEL'])\n"
    )
    env = _clean_env(tmp_path / "home")
    env["PYTHONPATH"] = str(REPO)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    logs = list((tmp_path / "home").rglob("console.log"))
    assert logs, "no console.log in the user log dir"
    text = logs[0].read_text()
    assert "to stdout" in text and "to stderr" in text
    assert (tmp_path / "home" / "model.txt").read_text() == str(models / "m.gguf")


def test_desktop_entry_and_launcher():
    entry = (REPO / "packaging/linux/ridgefill.desktop").read_text().splitlines()
    assert entry[0] == "[Desktop Entry]"
    fields = dict(line.split("=", 1) for line in entry[1:] if "=" in line)
    assert fields["Exec"] == "ridgefill" and fields["Icon"] == "ridgefill" and fields["Type"] == "Application"
    launcher = REPO / "packaging/linux/ridgefill.sh"
    assert os.access(launcher, os.X_OK)
    assert "opt/ridgefill/ridgefill" in launcher.read_text()


def _is_lab(name: str) -> bool:
    return name == "lab" or name.startswith(("lab.", "lab/"))


def test_the_spec_leaves_the_lab_out():
    """The bundle is the product: the spec, run with PyInstaller's build steps stubbed, lists no module
    and no file of the lab (lab/) and excludes the package; the product's modules are all there."""
    seen = {}

    def analysis(scripts, **kw):
        seen.update(kw)
        return SimpleNamespace(pure=[], scripts=[], binaries=[], datas=[])

    def step(*args, **kw):
        return SimpleNamespace()

    spec = REPO / "packaging" / "ridgefill.spec"
    names = {"SPECPATH": str(spec.parent), "Analysis": analysis, "PYZ": step, "EXE": step, "COLLECT": step,
             "BUNDLE": step, "__name__": "ridgefill_spec"}
    exec(compile(spec.read_text(encoding="utf-8"), str(spec), "exec"), names)
    assert "lab" in seen["excludes"]
    assert not [m for m in seen["hiddenimports"] if _is_lab(m)]
    assert not [dest for _, dest in seen["datas"] if _is_lab(dest)]
    for module in ("app.cli", "app.recall_task", "backend.recall.run", "backend.tuning.tune", "ui.recall_panel"):
        assert module in seen["hiddenimports"]


# ---- the real build ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Clone HEAD into a temporary folder and run the Linux build there (what `make package` runs)."""
    try:
        import PyInstaller  # noqa: F401
    except ImportError:
        pytest.fail("PyInstaller is not installed: run `make install` (the 'package' extra pins it)")
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", REPO.as_uri(), str(src)], check=True, timeout=300)
    env = dict(os.environ, PY=sys.executable)
    env.pop("PYTHONPATH", None)
    r = subprocess.run(["bash", "packaging/build_linux.sh"], cwd=src, env=env, capture_output=True, text=True,
                       timeout=3600)
    print(r.stdout[-3000:])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-5000:]
    return tmp, src / "dist"


def _selftest(program: Path, home: Path, cwd: Path) -> str:
    r = subprocess.run([str(program), "--selftest"], cwd=cwd, env=_clean_env(home), capture_output=True,
                       text=True, timeout=1200)
    print(r.stdout)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "self-test passed" in r.stdout
    assert "bundled" in r.stdout  # ran the frozen program, not a Python from the path
    return r.stdout


@pytest.mark.slow
def test_bundle_is_trimmed_and_passes_selftest(built):
    tmp, dist = built
    app = dist / "ridgefill"
    internal = app / "_internal"
    assert (internal / "models" / "gemma-3-270m-Q4_K_M.gguf").is_file()
    assert (internal / "backend" / "data" / "corpus").is_dir()
    assert (internal / "llama_cpp" / "lib" / "libllama.so").is_file()
    assert (internal / "llama_cpp" / "lib" / "libggml-base.so").is_file()
    assert not list((internal / "llama_cpp" / "lib").glob("libmtmd*"))
    assert [p.name for p in (internal / "torch" / "bin").iterdir()] == ["torch_shm_manager"]  # import torch checks it
    for gone in ("torch/include", "torch/test", "torch/_inductor", "torch/_dynamo", "sympy",
                 "torchvision", "PySide6/Qt/lib/libQt6Qml.so.6", "PySide6/Qt/lib/libQt6Quick.so.6",
                 "PySide6/QtNetwork.abi3.so"):
        assert not (internal / gone).exists(), f"{gone} should not be bundled"
    assert (internal / "PySide6" / "Qt" / "plugins" / "platforms" / "libqoffscreen.so").is_file()
    assert not (internal / "lab").exists()
    modules = _bundled_modules(app / "ridgefill")
    assert "app.cli" in modules and "backend.tuning.tune" in modules  # the listing is read right
    assert not [m for m in modules if _is_lab(m)], "the lab should not be bundled"
    _selftest(app / "ridgefill", tmp / "home-bundle", tmp)


def _bundled_modules(program: Path) -> set[str]:
    """Every name in the program's archives (its PYZ's modules among them), as pyi-archive_viewer lists them."""
    viewer = Path(sys.executable).with_name("pyi-archive_viewer")
    r = subprocess.run([str(viewer), "--recursive", "--brief", str(program)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return {line.strip() for line in r.stdout.splitlines() if line.startswith(" ")}


@pytest.mark.slow
def test_tarball_unpacks_to_the_same_folder(built):
    tmp, dist = built
    (tarball,) = dist.glob("ridgefill-*-linux-*.tar.gz")
    with tarfile.open(tarball) as tf:
        names = tf.getnames()
    assert "ridgefill/ridgefill" in names
    assert "ridgefill/_internal/models/gemma-3-270m-Q4_K_M.gguf" in names


@pytest.mark.slow
def test_deb_installs_into_a_scratch_root_and_its_launcher_passes_selftest(built):
    if shutil.which("dpkg-deb") is None:
        pytest.skip("dpkg-deb not found (not a Debian-based system)")
    tmp, dist = built
    (deb,) = dist.glob("ridgefill_*.deb")
    fields = subprocess.run(["dpkg-deb", "--field", str(deb), "Package", "Architecture", "Depends"],
                            capture_output=True, text=True, check=True).stdout
    assert "Package: ridgefill" in fields and "libc6" in fields
    root = tmp / "root"
    subprocess.run(["dpkg", "-x", str(deb), str(root)], check=True, timeout=600)
    launcher = root / "usr" / "bin" / "ridgefill"
    assert os.access(launcher, os.X_OK)
    assert (root / "opt" / "ridgefill" / "ridgefill").is_file()
    assert "Exec=ridgefill" in (root / "usr/share/applications/ridgefill.desktop").read_text()
    assert (root / "usr/share/icons/hicolor/256x256/apps/ridgefill.png").is_file()
    _selftest(launcher, tmp / "home-deb", tmp)
