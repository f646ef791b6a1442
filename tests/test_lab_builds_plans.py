"""The lab builds plans, never patches the product: an experiment's variant of RidgeFill is handed in by
its plan (lab/evals/plans.py), so no module of lab/ assigns to the product's modules, classes or methods,
or reaches for a private name of it. An AST walk over lab/ holds this."""
from __future__ import annotations

import ast
from pathlib import Path

from backend.ridgefill.late_inputs import MapsInputs
from backend.ridgefill.plan import RidgeFillPlan

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("app", "backend", "ui")


def _product_def_names() -> set[str]:
    """The product's method names that are never data (a field or an attribute set anywhere in it):
    assigning one on an object patches that method."""
    methods, data = set(), set()
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    methods.update(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
                    data.update(n.target.id for n in node.body
                                if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name))
                elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    data.update(t.attr for t in targets if isinstance(t, ast.Attribute))
    return {m for m in methods - data if not m.startswith("__")}


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _imported_names(tree: ast.AST) -> set[str]:
    """Names a module binds by importing from the product (modules, classes, functions)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PRODUCT:
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] in PRODUCT)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(source: str, where: str, def_names: set[str]) -> list[str]:
    tree = ast.parse(source)
    imported, found = _imported_names(tree), []
    for node in ast.walk(tree):
        line = f"{where}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in PRODUCT:
            found += [f"{line}: imports the private {a.name}" for a in node.names if _private(a.name)]
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root_name(node) in imported:
            found.append(f"{line}: reads the private {node.attr}")
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            if not isinstance(target, ast.Attribute):
                continue
            if _root_name(target) in imported:
                found.append(f"{line}: assigns {ast.unparse(target)}, the product's")
            elif target.attr in def_names and _root_name(target) not in ("self", "cls"):
                found.append(f"{line}: replaces the method {ast.unparse(target)}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            found.append(f"{line}: calls {node.func.id}")
    return found


def test_no_module_of_the_lab_patches_the_product_or_imports_its_private_names():
    def_names = _product_def_names()
    found = [v for path in sorted((ROOT / "lab").rglob("*.py"))
             for v in violations(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)), def_names)]
    assert found == []


def test_the_walk_sees_each_kind_of_patch():
    def_names = {"compute", "prefill_bulk"}
    patches = {
        "from backend.ridgefill import injection\ninjection.prefill_bulk = None\n": "assigns",
        "from backend.ridgefill.injection import _Prefill\n": "private",
        "from backend.ridgefill import kv_writer\nx = kv_writer._matmul\n": "private",
        "writer = object()\nwriter.compute = print\n": "method",
        "import backend.engine as e\ne.GGML_TYPE_F16 = 8\n": "assigns",
        "setattr(object(), 'compute', print)\n": "setattr",
    }
    for source, kind in patches.items():
        found = violations(source, "x.py", def_names)
        assert len(found) == 1 and kind in found[0], (source, found)
    assert violations("request = object()\nrequest.max_tokens = 1\n", "x.py", def_names) == []


def test_a_plan_hands_in_where_the_late_inputs_come_from_and_what_writes_the_kv(small_engine):
    """What the plan's `inputs` and `kv` give is what the bulk pass writes (the lab's oracles ride on it)."""
    from backend.protocol import CompletionRequest
    from backend.ridgefill.injection import prefill_bulk
    from backend.ridgefill.plan import plan_prefill
    from dataclasses import replace

    engine = small_engine
    tokens = engine.tokenize("The quick brown fox jumps over the lazy dog. " * 60)[:512]
    request = CompletionRequest(prompt="x", mode="speed", max_tokens=1)
    plan = plan_prefill(engine, request, 4096)
    assert isinstance(plan, RidgeFillPlan)
    asked, written = [], []

    def inputs(engine_, plan_, bulk, start, cancel):
        asked.append((len(bulk), start))
        return MapsInputs(plan_.maps)

    def kv(writer, il, h, pos):
        written.append(il)
        k, v = writer.compute(il, h, pos)
        return k * 0, v * 0

    with engine.scratch():
        prefill_bulk(engine, replace(plan, inputs=inputs, kv=kv, tag="zero-kv"), tokens)
    assert asked == [(len(tokens), 0)]
    assert sorted(set(written)) == list(range(plan.split, engine.info.n_layer))
