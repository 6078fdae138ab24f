"""Imports point inward: the protocol core does no I/O and knows nothing of the edges."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from pathlib import Path

import pytest

import proxy

PROXY = Path(proxy.__file__).parent
# What the pure core may import besides itself and the standard library's pure parts.
CORE_ALLOWED_THIRD_PARTY = {"orjson", "pydantic"}
IO_MODULES = {"asyncio", "socket", "subprocess", "aiohttp", "structlog", "prometheus_client", "logging", "time"}


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                package = ".".join(path.relative_to(PROXY.parent).with_suffix("").parts[: -node.level])
                names.add(f"{package}.{node.module}" if node.module else package)
            elif node.module:
                names.add(node.module)
    return names


def core_modules() -> list[Path]:
    return sorted((PROXY / "protocol").glob("*.py"))


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.name)
def test_protocol_core_imports_no_io_and_nothing_outside_the_core(path: Path) -> None:
    for name in imports_of(path):
        top = name.split(".")[0]
        if top == "proxy":
            assert name.startswith("proxy.protocol"), f"{path.name} imports {name}"
        else:
            assert top not in IO_MODULES, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", sorted(PROXY.rglob("*.py")), ids=lambda p: str(p.relative_to(PROXY)))
def test_no_module_imports_the_downstream_edge_except_the_composition_root(path: Path) -> None:
    relative = path.relative_to(PROXY)
    if relative.parts[0] == "downstream" or relative.name in ("app.py", "cli.py", "__main__.py"):
        return
    assert not any(name.startswith("proxy.downstream") for name in imports_of(path)), relative


def test_every_module_imports_on_its_own() -> None:
    for module in pkgutil.walk_packages(proxy.__path__, "proxy."):
        if module.name != "proxy.__main__":
            importlib.import_module(module.name)
