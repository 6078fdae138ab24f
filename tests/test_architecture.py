"""Imports point inward: the protocol core does no I/O and knows nothing of the edges."""

from __future__ import annotations

import ast
import pkgutil
import re
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


# ---------------------------------------------------------------- the packages and their layers

# Inner to outer: a module imports only from its own package or from a lower rank. The root keeps
# only the composition (app, cli) and the cross-cutting pieces every layer may use.
RANKS = {
    "protocol": 0,  # the pure core
    "seams": 0,  # the dependencies' private parts, each behind a checked adapter
    "__init__": 1,
    "config": 1,
    "errors": 1,
    "metrics": 1,
    "logs": 1,
    "state": 2,  # what outlives a request: sessions, task records, the stores, sealing, the cache
    "tracing": 2,
    "auth": 3,
    "upstream": 3,  # the server-side edge
    "cluster": 3,  # replicas: owners, forwarding, replay, workers
    "relay": 4,  # executes the core's decisions between the edges
    "downstream": 5,  # the client-side edge
    "app": 6,  # the composition root
    "cli": 7,
    "__main__": 8,
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PROXY.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project's modules it imports (at any depth of the file: a lazy import counts)."""
    modules = {module_name(p) for p in PROXY.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for path in PROXY.rglob("*.py"):
        tree = ast.parse(path.read_text())
        package = list(path.relative_to(PROXY.parent).with_suffix("").parts)[:-1]
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = (
                    ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                    if node.level
                    else node.module or ""
                )
                for alias in node.names:  # `from . import x` imports the module x
                    found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        graph[module_name(path)] = {name for name in found if name in modules} - {module_name(path)}
    return graph


def home(module: str) -> str:
    """The package (or root module) a module belongs to: proxy.relay.routes -> relay."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_root_holds_only_the_composition_and_the_cross_cutting_pieces() -> None:
    root = {p.stem for p in PROXY.glob("*.py")}
    packages = {p.name for p in PROXY.iterdir() if (p / "__init__.py").exists()}
    assert root <= {"__init__", "__main__", "app", "cli", "config", "errors", "logs", "metrics"}, root
    assert len(root) <= 10
    assert packages | root <= set(RANKS), (packages | root) - set(RANKS)  # every home has a rank


def test_imports_point_inward_across_the_packages() -> None:
    backwards = [
        f"{module} imports {name}"
        for module, names in import_graph().items()
        for name in names
        if home(name) != home(module) and RANKS[home(name)] >= RANKS[home(module)]
    ]
    assert not backwards, "\n".join(sorted(backwards))


def test_the_cluster_is_used_only_by_the_downstream_edge_and_the_composition() -> None:
    users = {home(module) for module, names in import_graph().items() for name in names if home(name) == "cluster"}
    assert users - {"cluster"} <= {"downstream", "app", "cli"}, users


def test_no_import_circle() -> None:
    """Not even a lazy one: a circle of modules (Tarjan's strongly connected components)."""
    graph = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for name in graph[module]:
            if name not in index:
                visit(name)
                low[module] = min(low[module], low[name])
            elif name in stack:
                low[module] = min(low[module], index[name])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                circles.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    assert not circles, circles


MAX_LINES = 600
LONG_BY_NATURE = {"config.py"}  # the settings catalogue: one documented model per section


def test_no_source_file_a_newcomer_must_read_whole_is_over_600_lines() -> None:
    """A rule is found in a file of one job; the settings catalogue is a reference, read by section."""
    long = {
        str(path.relative_to(PROXY)): lines
        for path in PROXY.rglob("*.py")
        if str(path.relative_to(PROXY)) not in LONG_BY_NATURE
        and (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


DESIGN = Path(__file__).parent.parent / "docs" / "design.md"


def design_map() -> set[str]:
    """The modules docs/design.md §Layers "The map" names, as paths under proxy/."""
    text = DESIGN.read_text(encoding="utf-8")
    table = text[text.index("### The map") :].split("\n\n", 2)[2].split("\n\n", 1)[0]
    named: set[str] = set()
    package = ""
    for row in table.splitlines()[2:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        if cells[0]:
            package = "" if cells[0] == "root" else cells[0].strip("`")
        named |= {package + name for name in re.findall(r"`([\w/]+\.py)`", cells[1])}
    return named


def test_the_design_notes_map_names_every_module_and_only_modules_that_exist() -> None:
    modules = {
        str(path.relative_to(PROXY)) for path in PROXY.rglob("*.py") if path.name not in {"__init__.py", "__main__.py"}
    }
    named = design_map()
    assert modules - named == set(), "modules missing from docs/design.md's map"
    assert {name for name in named if not (PROXY / name).exists()} == set(), "the map names files that do not exist"


# ---------------------------------------------------------------- the unit tests mirror the packages

UNIT = Path(__file__).parent / "unit"


def unit_tests() -> list[Path]:
    return sorted(UNIT.rglob("test_*.py"))


def proxy_imports_of_test(path: Path) -> set[str]:
    """The project's modules a test file imports (`from proxy import tracing` counts as proxy.tracing),
    itself or through the helpers of a sibling test it imports (tests.unit.state.test_cache)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "proxy":
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tests.unit."):
            sibling = UNIT.joinpath(*node.module.split(".")[2:]).with_suffix(".py")
            if sibling.parent == path.parent and sibling != path:
                names |= proxy_imports_of_test(sibling)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.split(".")[0] == "proxy")
    return names


@pytest.mark.parametrize("path", unit_tests(), ids=lambda p: p.relative_to(UNIT).as_posix())
def test_a_unit_test_sits_under_the_package_of_the_module_it_tests(path: Path) -> None:
    """tests/unit/<package>/test_x.py tests a module of proxy/<package>/ (so it imports one), and
    tests/unit/test_x.py one of the root's modules, proxy/x.py."""
    package = path.parent.relative_to(UNIT).parts
    if not package:
        assert (PROXY / f"{path.stem.removeprefix('test_')}.py").is_file(), f"no root module proxy/{path.name[5:]}"
        return
    assert (PROXY.joinpath(*package) / "__init__.py").is_file(), f"tests/unit/{'/'.join(package)} names no package"
    dotted = ".".join(("proxy", *package))
    imported = proxy_imports_of_test(path)
    assert any(name == dotted or name.startswith(f"{dotted}.") for name in imported), f"imports nothing of {dotted}"


def test_the_unit_test_layout_check_sees_every_directory() -> None:
    directories = {p.parent.relative_to(UNIT).as_posix() for p in unit_tests()}
    assert {".", "protocol", "relay", "state", "auth", "cluster", "downstream", "upstream", "tracing"} <= directories


SUPPORT = Path(__file__).parent / "support"


@pytest.mark.parametrize("path", sorted(SUPPORT.glob("*.py")), ids=lambda p: p.name)
def test_every_support_module_says_what_it_is_for_and_the_tests_readme_lists_it(path: Path) -> None:
    assert ast.get_docstring(ast.parse(path.read_text())), f"{path.name} has no docstring"
    if path.name != "__init__.py":
        assert f"`{path.name}`" in (SUPPORT.parent / "README.md").read_text(), f"tests/README.md omits {path.name}"
