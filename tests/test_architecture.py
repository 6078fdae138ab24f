"""Imports point inward: the protocol core does no I/O and knows nothing of the edges."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
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


@pytest.mark.parametrize("path", sorted(PROXY.rglob("*.py")), ids=lambda p: str(p.relative_to(PROXY)))
def test_the_downstream_edge_never_imports_the_upstream_edge(path: Path) -> None:
    # The edges meet only through the relays: downstream reads and writes HTTP, upstream talks to
    # servers, and what connects them (routing, the byte relay, failure mapping) lives in relay/.
    relative = path.relative_to(PROXY)
    if relative.parts[0] != "downstream":
        return
    assert not any(name.startswith("proxy.upstream") for name in imports_of(path)), relative


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    """An import cycle shows only when a module of the cycle is imported before the others, so
    each module is imported first, with none of the project's modules loaded (aiohttp's habit)."""
    names = [m.name for m in pkgutil.walk_packages(proxy.__path__, "proxy.") if m.name != "proxy.__main__"]
    script = (
        "import importlib, sys\n"
        "failed = []\n"
        "for name in sys.argv[1:]:\n"
        "    for loaded in [m for m in sys.modules if m == 'proxy' or m.startswith('proxy.')]:\n"
        "        del sys.modules[loaded]\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception as exc:\n"
        "        failed.append(f'{name}: {exc!r}')\n"
        "print('\\n'.join(failed))\n"
        "sys.exit(1 if failed else 0)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=120, cwd=PROXY.parent
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(names) > 40  # every module was tried
