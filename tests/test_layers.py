"""The core's dependency order (``vcsched.LAYERS``, written down in vcsched/__init__.py) holds in the code.

* Every module of ``vcsched`` belongs to a layer: a top-level module is its own, a sub-package is one.
* No module imports from a layer above its own (``TYPE_CHECKING`` imports included: a type from above is a
  dependency on it too).
* No import hides inside a function to dodge that order: imports of ``vcsched`` are at the top of a module.
  The only imports a function may make are of heavy third-party libraries kept lazy so that commands that
  do not need them start fast (scipy, cvxpy, matplotlib, prometheus_client), each with a comment saying so,
  and the few of :data:`LAZY_NUMPY`: modules of lower layers (so no cycle is dodged) that bring numpy, kept
  lazy where every command passes (reading the cluster file) so that commands that need no numpy (apply,
  repair, cordon, lab) start without it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import vcsched

ROOT = Path(vcsched.__file__).parent
LAZY = ("scipy", "cvxpy", "matplotlib", "prometheus_client")
#: (module, import) pairs allowed inside a function: numpy kept out of every command's start (see above).
LAZY_NUMPY = {("formats/cluster.py", t) for t in ("vcsched.policies.allocation", "vcsched.policies.registry",
                                                    "vcsched.formats.instance", "vcsched.model", "vcsched.validate")}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def layer_of(module: str) -> str | None:
    """``vcsched.solvers.mcb`` -> ``solvers``; ``vcsched.model`` -> ``model``; ``vcsched`` -> None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def imports(path: Path) -> list[tuple[int, str, bool]]:
    """``(line, imported module, inside a function)`` for every import of the file."""
    tree = ast.parse(path.read_text())
    in_function: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            in_function |= {id(n) for n in ast.walk(node)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, id(node) in in_function) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module, id(node) in in_function))
    return out


def test_every_module_is_in_a_layer() -> None:
    unknown = sorted({layer for m in modules() if (layer := layer_of(m)) is not None} - set(vcsched.LAYERS))
    assert unknown == [], f"add these to vcsched.LAYERS: {unknown}"


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    rank = {layer: i for i, layer in enumerate(vcsched.LAYERS)}
    wrong = []
    for name, path in modules().items():
        own = layer_of(name)
        if own is None:  # the package's __init__: the lazy public API (PEP 562), above everything
            continue
        for line, target, _ in imports(path):
            other = layer_of(target) if target.startswith("vcsched.") else None
            if other is not None and rank[other] > rank[own]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {own} imports {target} ({other} is above)")
    assert wrong == []


def test_no_import_hides_inside_a_function_but_a_commented_lazy_heavy_library() -> None:
    wrong = []
    for path in modules().values():
        lines = path.read_text().splitlines()
        for line, target, inside in imports(path):
            if not inside:
                continue
            lazy = target.split(".")[0] in LAZY or (str(path.relative_to(ROOT)), target) in LAZY_NUMPY
            commented = "#" in lines[line - 1] or lines[line - 2].strip().startswith("#")
            if not (lazy and commented):
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: import {target} inside a function")
    assert wrong == []


#: The packages around the core and what each may not import (docs/architecture.md): data flows one way,
#: CLI/controller → core decides → plan → unit of work (acting) → adapter (hypervisor).  The lab, the fault
#: simulation and calibration are harnesses and subjects built on top; nothing below imports them.
FORBIDDEN = {
    "vcsched": ("hypervisor", "acting", "lab", "faultsim", "calibration", "cli"),
    "hypervisor": ("acting", "lab", "faultsim", "calibration", "cli"),
    "acting": ("lab", "faultsim", "cli"),
}


def test_each_package_imports_nothing_above_it() -> None:
    """Every import counts, inside functions and under ``TYPE_CHECKING`` too: a lazy import of a harness from
    production code is still a dependency on it (calibration needed the lab through hypervisor/caps_probe.py,
    the journal the executor through hypervisor/journal.py)."""
    wrong = []
    for package, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT.parent / package).rglob("*.py")):
            for line, target, _ in imports(path):
                if target.split(".")[0] in forbidden:
                    wrong.append(f"{path.relative_to(ROOT.parent)}:{line}: {package} imports {target}")
    assert wrong == []
