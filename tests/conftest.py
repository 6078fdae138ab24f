"""Test-wide guards."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from blockbuster import BlockBuster, blockbuster_ctx


@pytest.fixture(autouse=True)
def blockbuster() -> Iterator[BlockBuster]:
    """Fail any test in which the proxy's own code makes a blocking call on the event loop (file
    or socket I/O, sleeps, subprocess waits): it would stall every other request."""
    with blockbuster_ctx("proxy") as guard:
        yield guard
