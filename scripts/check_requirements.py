"""docker/requirements.txt against the environment it was installed in, as the image installs it
(`pip install --no-deps -r`, then the project `--no-deps`): every line an exact pin (`name==version`),
every distribution installed pinned at its version, and every pin installed. `pip check` beside it
(scripts/lint-deploy.sh) says that every dependency of each is there, in its range: together, the
pins are complete and nothing outside them gets into the image.

Run with the interpreter of that environment (the standard library only):
    venv/bin/python scripts/check_requirements.py docker/requirements.txt
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

_PIN = re.compile(r"([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)")
# What a virtualenv brings itself, and the project (installed from its source, not pinned).
NOT_PINNED = {"pip", "setuptools", "wheel", "mcp-era-proxy"}


def normalized(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(requirements: str, installed: dict[str, str]) -> list[str]:
    """What is wrong with `requirements` (the file's text) for `installed` (name -> version)."""
    found: list[str] = []
    pins: dict[str, str] = {}
    for number, raw in enumerate(requirements.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pin = _PIN.fullmatch(line)
        if pin is None:
            found.append(f"line {number}: {line!r} is not an exact pin (name==version)")
            continue
        pins[normalized(pin[1])] = pin[2]
    present = {normalized(name): version for name, version in installed.items()}
    for name, version in sorted(present.items()):
        if name in NOT_PINNED:
            continue
        if name not in pins:
            found.append(f"{name} {version} is installed but not pinned")
        elif pins[name] != version:
            found.append(f"{name} is installed at {version}, pinned at {pins[name]}")
    found += [f"{name}=={pins[name]} is pinned but not installed" for name in sorted(set(pins) - set(present))]
    return found


def main() -> int:
    path = sys.argv[1]
    with open(path, encoding="utf-8") as file:
        text = file.read()
    installed = {dist.metadata["Name"]: dist.version for dist in metadata.distributions()}
    found = problems(text, installed)
    for problem in found:
        print(f"{path}: {problem}")
    if not found:
        print(f"ok   {path}: exact pins, every installed distribution pinned at its version")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
