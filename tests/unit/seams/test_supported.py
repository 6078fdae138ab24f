"""The start-up's verdict on the dependencies' private parts (proxy/seams/supported.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import aiohttp
import pytest

from proxy.seams import aiohttp_internals
from proxy.seams.supported import declared_range, refusal

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def declared(name: str) -> str:
    """The range pyproject.toml gives `name`, its bounds in the order the refusal names them."""
    for requirement in tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]:
        found = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?([^;]*)", requirement)
        assert found is not None
        if found[1] == name:
            return ",".join(sorted(found[2].split(","), key=lambda part: not part.startswith(">")))
    raise AssertionError(name)


def test_the_range_said_is_the_one_pyproject_declares() -> None:
    assert declared_range("aiohttp") == declared("aiohttp")
    assert declared_range("AIOHTTP") == declared("aiohttp")
    assert declared_range("pydantic-settings") == declared("pydantic-settings")
    assert declared_range("not-a-dependency") == "(the range pyproject.toml declares)"


def test_the_installed_aiohttp_is_not_refused() -> None:
    assert refusal() is None


def test_an_aiohttp_without_what_the_read_deadlines_rely_on_is_refused_naming_it_and_the_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delattr(aiohttp_internals.RequestHandler, "_messages")
    said = refusal()
    assert said is not None
    assert f"aiohttp {aiohttp.__version__} is installed" in said
    assert "RequestHandler._messages is missing" in said
    assert said.endswith(f"aiohttp{declared('aiohttp')}")
