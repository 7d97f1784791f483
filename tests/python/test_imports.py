"""The Python package's modules import one way: no module of python/fattn imports one that
imports it back (at module level or inside a function), so each reads as a layer. Read from
the sources (ast), not by importing them."""
import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "fattn"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, name: str) -> set:
    """fattn modules a file imports: `from . import x` imports fattn.x (a module, or the
    extension fattn._C), not the package it sits in."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if node.module is None:
                found.update(f"{target}.{a.name}" for a in node.names)
            else:
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "fattn" or m.startswith("fattn.")} - {name}


def test_no_module_imports_one_that_imports_it_back():
    graph = {module_name(p): imported_modules(p, module_name(p))
             for p in PACKAGE.rglob("*.py")}
    assert len(graph) > 20  # the package was found
    cycles = sorted({tuple(sorted((a, b))) for a, targets in graph.items() for b in targets
                     if a in graph.get(b, ())})
    assert cycles == [], cycles
