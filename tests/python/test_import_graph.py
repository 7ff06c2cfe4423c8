"""The Python package's import graph, read from the sources with `ast`
(nothing is imported): it has no cycle, and no module imports a module of
the package inside a function (the usual way to hide a cycle), nor through
importlib with a name built at run time. Inside a function a module imports
only the optional packages of OPTIONAL (what `import shardsafe` must not
need); everything else is imported at module level.

Every import statement counts, at module level or not (under `if
TYPE_CHECKING:` too). `from . import X` is an edge to the module X where X
is one, else to the package. The compiled extension shardsafe._C imports
nothing of the package: it is a leaf. A submodule's implicit import of its
parent packages is not an edge (a package's __init__ importing its own
submodules is how a package exposes them).

The checker runs first on small synthetic packages, so that a failure here
is known to name the cycle or the import it found.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[2] / "python" / "shardsafe"
EXTENSIONS = {"_C"}  # compiled modules of the package (no Python imports)
# Imported inside the functions that need them, so that `import shardsafe`
# works without them: safetensors (nanotron weights, per-rank value blobs),
# peft (adapters), tqdm (progress bars), torch.distributed.tensor (DTensor,
# where a torch build may lack it).
OPTIONAL = ("safetensors", "peft", "tqdm", "torch.distributed.tensor")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of the package
    line: int
    local: bool  # inside a function


def modules(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under `package_dir`, by dotted name (a
    package by its own name)."""
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(names: dict[str, Path], package: str, node: ast.ImportFrom | ast.Import,
             top: str) -> list[str]:
    """The modules of the package an import statement imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == top or a.name.startswith(top + ".")]
    if node.level:
        base_parts = package.split(".")[:len(package.split(".")) - (node.level - 1)]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base != top and not base.startswith(top + "."):
        return []
    out = []
    for alias in node.names:
        name = f"{base}.{alias.name}"
        if name in names:
            out.append(name)
        elif alias.name in EXTENSIONS and base == top:
            continue  # the compiled extension: a leaf
        else:
            out.append(base)  # a name the module `base` defines
    return out


def _dynamic(node: ast.Call) -> bool:
    """importlib.import_module / __import__ of a name built from the
    package's own (__package__, __name__) or naming it."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    if name not in ("import_module", "__import__") or not node.args:
        return False
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value.startswith((".", "shardsafe"))
    return any(isinstance(n, ast.Name) and n.id in ("__package__", "__name__")
               for n in ast.walk(arg))


def _others(node: ast.ImportFrom | ast.Import, top: str) -> list[str]:
    """The modules outside the package an import statement imports."""
    if isinstance(node, ast.ImportFrom):
        return [] if node.level or (node.module or "").split(".")[0] == top else [node.module]
    return [a.name for a in node.names if a.name.split(".")[0] != top]


def _optional(module: str) -> bool:
    return any(module == o or module.startswith(o + ".") for o in OPTIONAL)


def imports(package_dir: Path) -> tuple[list[Import], list[str], list[str]]:
    """Every import of a module of the package by a module of it; the
    dynamic imports of its own modules ("FILE:LINE"); and the imports of
    other modules inside a function that OPTIONAL does not list (one line
    each)."""
    names = modules(package_dir)
    top = package_dir.name
    found, dynamic, local_others = [], [], []
    for module, path in names.items():
        tree = ast.parse(path.read_text(), str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                local = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in _resolve(names, package, child, top):
                        found.append(Import(module, target, child.lineno, in_function))
                    if in_function:
                        local_others.extend(
                            f"{module} imports {other} inside a function (line {child.lineno}), "
                            f"which is no optional package (OPTIONAL)"
                            for other in _others(child, top) if not _optional(other))
                elif isinstance(child, ast.Call) and _dynamic(child):
                    dynamic.append(f"{path}:{child.lineno}")
                visit(child, local)

        visit(tree, False)
    return found, dynamic, local_others


def find_cycle(edges: list[Import]) -> list[str] | None:
    """A cycle of the import graph, as its modules (the first one repeated
    at the end), or None."""
    graph: dict[str, list[str]] = {}
    for e in edges:
        if e.target != e.source:
            graph.setdefault(e.source, []).append(e.target)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, iters = [start], [iter(sorted(set(graph.get(start, []))))]
        state[start] = 1
        while path:
            nxt = next(iters[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                iters.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                iters.append(iter(sorted(set(graph.get(nxt, [])))))
    return None


def problems(package_dir: Path) -> list[str]:
    """What this test refuses, one line each (empty: none)."""
    edges, dynamic, local_others = imports(package_dir)
    out = list(dict.fromkeys(f"{e.source} imports {e.target} inside a function (line {e.line})"
                             for e in edges if e.local))
    out += local_others
    out += [f"{where}: importlib imports a module of the package" for where in dynamic]
    cycle = find_cycle(edges)
    if cycle:
        out.append("import cycle: " + " -> ".join(cycle))
    return out


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    pkg = tmp_path / "shardsafe"
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return pkg


def test_the_checker_names_a_cycle_and_a_function_local_import(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from . import _C, b\n\ndef f():\n    from .c import g\n",
        "b.py": "import os\nfrom .sub.d import h\n",
        "c.py": "def g():\n    import json\n    from safetensors.torch import load\n",
        "sub/__init__.py": "",
        "sub/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from ..a import f\n",
    })
    assert problems(pkg) == [
        "shardsafe.a imports shardsafe.c inside a function (line 4)",
        "shardsafe.c imports json inside a function (line 2), which is no optional package "
        "(OPTIONAL)",
        "import cycle: shardsafe.a -> shardsafe.b -> shardsafe.sub.d -> shardsafe.a",
    ]


def test_the_checker_names_an_import_by_a_name_built_at_run_time(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "",
        "a.py": "import importlib\n\ndef load(name):\n"
                "    return importlib.import_module(f'{__package__}.{name}')\n",
        "b.py": "import importlib\n\ndef extra(name):\n    return importlib.import_module(name)\n",
    })
    assert problems(pkg) == [f"{pkg / 'a.py'}:4: importlib imports a module of the package"]


def test_the_package_has_no_import_cycle_and_no_function_local_import():
    assert (PACKAGE_DIR / "__init__.py").is_file(), PACKAGE_DIR
    edges, _, _ = imports(PACKAGE_DIR)
    assert len({e.source for e in edges}) > 20  # the package's modules were read
    found = problems(PACKAGE_DIR)
    assert not found, "\n".join(found)
