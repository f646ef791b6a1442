"""Architecture rules: the backend never imports Qt; the UI never calls llama.cpp itself."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(folder: str) -> dict[str, set[str]]:
    found = {}
    for path in (ROOT / folder).rglob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(ROOT))] = names
    return found


def test_backend_has_no_qt():
    offenders = {f: n & {"PySide6", "PyQt5", "PyQt6", "pyqtgraph", "ui", "app"}
                 for f, n in imported_modules("backend").items()}
    assert not {f: n for f, n in offenders.items() if n}


def test_ui_does_not_touch_llama_cpp():
    offenders = {f: n & {"llama_cpp"} for f, n in imported_modules("ui").items()}
    assert not {f: n for f, n in offenders.items() if n}
