"""The shape of the code (DESIGN.md §5), checked on its syntax trees (pure: nothing is run).

- the pure core imports only the standard library, numpy and itself;
- one family of primitive records (the DAG's nodes, :mod:`nereus.emu.primitives`);
- in the runtime only the controller rank's planner port plans a transition (the ranks execute
  the planned one they are sent);
- no module of ``nereus/runtime`` is pure configuration (that lives in ``nereus/config``);
- no private name is imported across modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ("spec", "config", "cost", "plan", "emu", "transition", "control")
# The stated exceptions: the config loader parses YAML (DESIGN.md §5: "YAML loading and
# validation ... pure + file read") and reads the headers of a checkpoint's safetensors files
# (names, dtypes, shapes: never the weights) through the safetensors library; the exact references (the ``solver`` extra) import their
# solver inside the function: an off-the-shelf MILP for plan search (SciPy's HiGHS) and
# constraint programming for transition scheduling (OR-Tools CP-SAT).
ALLOWED = {("nereus/config/load.py", "yaml"), ("nereus/plan/milp.py", "scipy"),
           ("nereus/transition/exact.py", "ortools"),
           ("nereus/config/checkpoint_files.py", "safetensors")}


def _modules(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (ROOT / part).rglob("*.py"))


def _imports(path: Path) -> list[tuple[str, tuple[str, ...], int]]:
    """(module, imported names, line) of every import in ``path``, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, (), node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, tuple(a.name for a in node.names), node.lineno))
    return out


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_pure_core_imports_only_the_standard_library_numpy_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"numpy", "nereus"}
    effectful_stdlib = {"subprocess", "socket", "threading", "signal", "ctypes", "multiprocessing"}
    bad = []
    for path in _modules(*(f"nereus/{p}" for p in PURE)):
        for module, _, line in _imports(path):
            top = module.split(".")[0]
            if (_rel(path), top) in ALLOWED:
                continue
            if top not in allowed or top in effectful_stdlib:
                bad.append(f"{_rel(path)}:{line}: {module}")
            elif module.startswith("nereus.") and module.split(".")[1] not in (*PURE, "errors"):
                bad.append(f"{_rel(path)}:{line}: {module} (the shell)")
    assert not bad, "\n".join(bad)


def test_one_family_of_primitive_records() -> None:
    where: dict[str, list[str]] = {}
    for path in _modules("nereus", "launchers"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in ("Split", "Merge", "Extend",
                                                                  "Destroy"):
                where.setdefault(node.name, []).append(_rel(path))
    assert where == {name: ["nereus/emu/primitives.py"]
                     for name in ("Split", "Merge", "Extend", "Destroy")}, where


def test_only_the_controller_ranks_port_plans_transitions_in_the_runtime() -> None:
    planners = {"plan_transition", "plan_plans", "plan_units", "compile_transition",
                "compile_plans", "batched_plans", "batched_units", "plan_change",
                "plan_staged", "fallback_transition"}
    found = []
    for path in _modules("nereus/runtime", "nereus/engines", "nereus/rl", "nereus/log"):
        for module, names, line in _imports(path):
            hits = planners & set(names)
            if module.startswith("nereus.transition") and (
                    hits or ".reference" in module or ".batched" in module):
                found.append((_rel(path), module, line))
    assert [f[0] for f in found] == ["nereus/runtime/rank0/controller.py"], found


def test_no_runtime_module_is_pure_configuration() -> None:
    """Configuration schemas and their parsing live in ``nereus/config``: no runtime module
    validates fields (``nereus.config.fields``), defines a ``parse_*`` function or a
    ``*Config`` / ``*Options`` record."""
    found = []
    for path in _modules("nereus/runtime"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for module, names, line in _imports(path):
            if module == "nereus.config.fields" or (module == "nereus.config" and
                                                    "fields" in names):
                found.append(f"{_rel(path)}:{line}: imports the field validators")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("parse_"):
                found.append(f"{_rel(path)}:{node.lineno}: def {node.name}")
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Config", "Options")):
                found.append(f"{_rel(path)}:{node.lineno}: class {node.name}")
    assert not found, found


def test_no_private_name_is_imported_across_modules() -> None:
    bad = []
    for path in _modules("nereus", "launchers", "benchmarks", "tests"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                    node.module.split(".")[0] in ("nereus", "launchers"):
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        bad.append(f"{_rel(path)}:{node.lineno}: {node.module}.{a.name}")
                    aliases[a.asname or a.name] = node.module
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in ("nereus", "launchers") and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and \
                    node.value.id in aliases and node.attr.startswith("_") and \
                    not node.attr.startswith("__"):
                bad.append(f"{_rel(path)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not bad, "\n".join(bad)
