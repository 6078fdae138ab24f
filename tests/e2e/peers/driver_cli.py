"""What the SDK scenario drivers of this folder share: the command line, the overall bound, and the
ONE JSON object printed on the last line of stdout (the observations, or the error with what was
seen before it). Free of any SDK, so the drivers of either SDK's virtualenv run it.

    <driver>.py --url URL --scenario NAME [--timeout SECONDS] [--args JSON]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import anyio


class Observing(Protocol):
    phase: str


def leaf_exception(exc: BaseException) -> BaseException:
    """First non-group exception inside (possibly nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def drive(
    description: str | None,
    scenarios: Mapping[str, Any],
    default_timeout: float,
    observer_of: Callable[[dict[str, Any]], Any],
    run: Callable[[str, str, dict[str, Any], float, Any, dict[str, Any]], Awaitable[None]],
    *,
    describe: Callable[[BaseException], str],
    observed: Callable[[str, Any], dict[str, Any]],
    error_data: Callable[[BaseException], Any] = lambda leaf: None,
) -> int:
    """Run one scenario: `run(url, scenario, args, timeout, observer, out)` fills `out`; what
    `observed(scenario, observer)` adds is printed with it, after a failure too."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="Streamable HTTP endpoint, e.g. http://127.0.0.1:3410/mcp")
    parser.add_argument("--scenario", required=True, choices=sorted(scenarios))
    parser.add_argument("--timeout", type=float, default=default_timeout, help="overall bound in seconds")
    parser.add_argument("--args", default="{}", help="JSON object of scenario arguments")
    ns = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    out: dict[str, Any] = {"scenario": ns.scenario}
    obs: Observing | None = None
    try:
        args = json.loads(ns.args)
        if not isinstance(args, dict):
            raise ValueError("--args must be a JSON object")
        obs = observer_of(args)
        anyio.run(run, ns.url, ns.scenario, args, ns.timeout, obs, out)
    except BaseException as exc:
        leaf = leaf_exception(exc)
        if isinstance(leaf, TimeoutError) and not str(leaf):
            message = f"TimeoutError: overall timeout {ns.timeout}s exceeded"
        else:
            message = describe(leaf)
        report: dict[str, Any] = {"error": message}
        data = error_data(leaf)
        if data is not None:
            report["errorData"] = data
        if obs is not None:
            report["phase"] = obs.phase
            report["observed"] = {**out, **observed(ns.scenario, obs)}
        sys.stdout.write("\n" + json.dumps(report, default=str) + "\n")
        sys.stdout.flush()
        return 1
    out.update(observed(ns.scenario, obs))
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0
