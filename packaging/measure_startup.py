"""Start-up time of the GUI to a mapped (visible) main window, under Xvfb.

Usage: python packaging/measure_startup.py [--runs N] [--cold DIR] [-- PROGRAM ARGS...]
PROGRAM defaults to dist/ridgefill/ridgefill; `-- .venv/bin/python -m app` times the source checkout.
Starts Xvfb on a free display unless $DISPLAY names one (needs `Xvfb` and `xwininfo`: apt-get install
xvfb x11-utils), launches the program with a scratch RIDGEFILL_HOME, polls the X server's window tree
until a viewable window titled "RidgeFill" appears, then ends the program. Prints each run and the
median. `--cold DIR` evicts every file under DIR from the page cache before each run
(posix_fadvise DONTNEED: only those files, nothing system-wide), so each start reads them from disk.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TITLE = "RidgeFill"


def window_visible(display: str) -> bool:
    out = subprocess.run(["xwininfo", "-root", "-tree"], env=dict(os.environ, DISPLAY=display),
                         capture_output=True, text=True).stdout
    for line in out.splitlines():
        if f'"{TITLE}' in line:
            wid = line.split()[0]
            info = subprocess.run(["xwininfo", "-id", wid], env=dict(os.environ, DISPLAY=display),
                                  capture_output=True, text=True).stdout
            if "IsViewable" in info:
                return True
    return False


def start_xvfb() -> tuple[subprocess.Popen, str]:
    for n in range(90, 110):
        if not Path(f"/tmp/.X{n}-lock").exists():
            proc = subprocess.Popen(["Xvfb", f":{n}", "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            display = f":{n}"
            for _ in range(100):
                if subprocess.run(["xwininfo", "-root"], env=dict(os.environ, DISPLAY=display),
                                  capture_output=True).returncode == 0:
                    return proc, display
                time.sleep(0.05)
            proc.kill()
    raise SystemExit("could not start Xvfb")


def evict(folder: Path) -> int:
    """Drop DIR's files from the page cache (clean pages only, which is all a read-only bundle has)."""
    n = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                n += 1
            finally:
                os.close(fd)
    return n


def one_run(cmd: list[str], display: str, timeout: float) -> float:
    with tempfile.TemporaryDirectory() as home:
        env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "PYTHONPATH")}
        env.update(DISPLAY=display, RIDGEFILL_HOME=home)
        if cmd[0].endswith("python") or "python" in Path(cmd[0]).name:
            env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
        t0 = time.perf_counter()
        errlog = open(Path(home) / "stderr.txt", "w+")
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=errlog,
                                start_new_session=True)
        try:
            while time.perf_counter() - t0 < timeout:
                if proc.poll() is not None:
                    errlog.seek(0)
                    raise SystemExit(f"the program exited with {proc.returncode} before showing a window:\n"
                                     + errlog.read()[-3000:])
                if window_visible(display):
                    return time.perf_counter() - t0
                time.sleep(0.05)
            raise SystemExit(f"no window within {timeout:.0f} s")
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """End the app and its engine child (they share the session the app was started in)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
            return
        except subprocess.TimeoutExpired:
            continue


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", nargs="*", default=["dist/ridgefill/ridgefill"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--cold", type=Path, help="evict this folder's files from the page cache before each run")
    args = ap.parse_args(argv)
    for tool in ("Xvfb", "xwininfo"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} not found: apt-get install xvfb x11-utils")
    xvfb, display = (None, os.environ["DISPLAY"]) if os.environ.get("DISPLAY") else start_xvfb()
    try:
        times = []
        for i in range(args.runs):
            if args.cold:
                evict(args.cold)
            t = one_run(args.program, display, args.timeout)
            times.append(t)
            print(f"run {i + 1}: window visible after {t:.2f} s", flush=True)
        print(f"{' '.join(args.program)}{' (cold: files evicted)' if args.cold else ''}: median {statistics.median(times):.2f} s over {len(times)} runs "
              f"(first {times[0]:.2f} s)")
    finally:
        if xvfb is not None:
            xvfb.terminate()
            xvfb.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
