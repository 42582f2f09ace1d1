"""The dependency rules of docs/ARCHITECTURE.md ("Layers"), checked on the source.

Every import statement is read from the syntax tree (function-level imports included), so a
lazy import that breaks a rule is caught as well as a top-level one. tests/ is white-box and
exempt from the private-name rule; everything else that ships or that users run is covered.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUBSYSTEMS = ("registry.tuning", "registry.daemon", "registry.observe")


def _files(*parts: str) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        path = ROOT / part
        out.extend(sorted(path.rglob("*.py")) if path.is_dir() else [path])
    return out


def _imports(path: Path, top_level_only: bool = False) -> Iterator[tuple[int, str, list[str]]]:
    """(line, module, imported names) of every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module, [a.name for a in node.names]
        elif top_level_only and isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks
            continue


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_registry_imports_neither_backends_nor_plugins() -> None:
    bad = [f"{_rel(p)}:{line} imports {mod}" for p in _files("registry")
           for line, mod, _ in _imports(p) if mod.split(".")[0] in ("backends", "plugins")]
    assert bad == []


def test_backends_import_no_plugin() -> None:
    bad = [f"{_rel(p)}:{line} imports {mod}" for p in _files("backends")
           for line, mod, _ in _imports(p) if mod.split(".")[0] == "plugins"]
    assert bad == []


def test_only_cli_modules_import_click_inside_registry() -> None:
    bad = [f"{_rel(p)}:{line}" for p in _files("registry") if p.name != "cli.py"
           for line, mod, _ in _imports(p) if mod.split(".")[0] == "click"]
    assert bad == []


def test_the_flat_core_imports_no_subsystem_at_import_time() -> None:
    core = [p for p in (ROOT / "registry").glob("*.py")]
    assert len(core) > 10
    bad = [f"{_rel(p)}:{line} imports {mod}" for p in core
           for line, mod, names in _imports(p, top_level_only=True)
           if mod.startswith(SUBSYSTEMS)
           or (mod == "registry" and any(f"registry.{n}" in SUBSYSTEMS for n in names))]
    assert bad == []


def test_import_registry_loads_no_subsystem_torch_or_triton() -> None:
    code = ("import sys, registry\n"
            "loaded = sorted(m for m in sys.modules if m.startswith('registry.') or "
            "m.split('.')[0] in ('torch', 'triton', 'backends', 'plugins', 'click'))\n"
            "print(loaded)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()
    loaded = eval(out)  # a list literal printed by the child
    assert [m for m in loaded if m.startswith(SUBSYSTEMS) or "." not in m] == [], loaded


@pytest.mark.parametrize("part", ["backends", "plugins", "cli.py", "benchmarks", "examples"])
def test_nothing_outside_registry_imports_a_private_registry_name(part: str) -> None:
    bad = []
    for p in _files(part):
        for line, mod, names in _imports(p):
            parts = mod.split(".")
            if parts[0] != "registry":
                continue
            private_module = any(x.startswith("_") for x in parts[1:])
            private_names = [n for n in names if n.startswith("_")]
            if private_module or private_names:
                bad.append(f"{_rel(p)}:{line} imports {mod} {private_names or ''}".rstrip())
    assert bad == []
