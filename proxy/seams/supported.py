"""The start-up's verdict on the dependencies' private parts (docs/design.md §Seams): a part with a
public fallback is replaced where it is used (and said as `dependency_fallback`); one without (the
HTTP server's read deadlines) makes the proxy refuse to start, naming the version installed and the
range this proxy is tested with."""

from __future__ import annotations

import re
from importlib import metadata

import aiohttp

from .aiohttp_internals import server_problems

DISTRIBUTION = "mcp-era-proxy"


def declared_range(dependency: str) -> str:
    """The versions of `dependency` this proxy declares (its package metadata, from pyproject.toml)."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return "(the range pyproject.toml declares)"
    for requirement in requirements:
        found = _REQUIREMENT.match(requirement)
        if found is not None and found["name"].lower() == dependency.lower() and not found["marker"]:
            specifiers = [part.strip() for part in found["versions"].split(",") if part.strip()]
            return ",".join(sorted(specifiers, key=lambda part: not part.startswith(">"))) or "(any version)"
    return "(the range pyproject.toml declares)"


# name[extras] versions; marker (PEP 508, as package metadata writes it)
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:\[[^]]*\])?(?P<versions>[^;]*)(?:;(?P<marker>.*))?$")


def refusal() -> str | None:
    """Why the proxy cannot run on the installed dependencies; None: it can."""
    problems = server_problems()
    if not problems:
        return None
    return (
        f"aiohttp {aiohttp.__version__} is installed, and its HTTP server lacks what the proxy's read deadlines "
        f"rely on ({'; '.join(problems)}): install the aiohttp this proxy is tested with, aiohttp"
        f"{declared_range('aiohttp')}"
    )


__all__ = ["declared_range", "refusal"]
