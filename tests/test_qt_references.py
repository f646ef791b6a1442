"""The Qt binding keeps Python's references: on CPython 3.11 None and True are ordinary objects, and a
binding that drops one reference per call (PySide6 6.12.0: every void method such as setText or
processEvents loses one of None's, every Signal.emit one of True's) ends a long session with "Fatal
Python error: none_dealloc". Checked in a child process, so a binding that fails cannot take pytest down."""
from __future__ import annotations

import subprocess
import sys

CALLS = 200  # far more than the few references ordinary work moves either way
CHECK = f"""
import sys
from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication, QLabel

class Sender(QObject):
    fired = Signal()

app = QApplication([])
label, sender = QLabel(), Sender()
none0, true0 = sys.getrefcount(None), sys.getrefcount(True)
for _ in range({CALLS}):
    label.setText("x")
    app.processEvents()
    sender.fired.emit()
print(sys.getrefcount(None) - none0, sys.getrefcount(True) - true0)
"""


def test_void_calls_and_emits_keep_their_references():
    run = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    none_drift, true_drift = map(int, run.stdout.split())
    assert none_drift > -CALLS // 2, f"None lost {-none_drift} references in {CALLS} rounds of void calls"
    assert true_drift > -CALLS // 2, f"True lost {-true_drift} references in {CALLS} signal emits"
