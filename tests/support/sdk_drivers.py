"""The real SDK clients as scenario drivers (tests/e2e/peers): the mcp==1.30.0 legacy client, the
mcp==2.3.0 modern client, and that SDK as a client of the tasks extension, each run in its own
virtualenv; used by tests/e2e and tests/replicas. `run_*` fork each run from a warm process of its
virtualenv (DriverPool: the SDK imported once per test process, not once per run); `*_argv` give
the command line, for a test that starts the driver itself."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import peers


def driver_argv(
    python: Path, script: str, url: str, scenario: str, args: dict[str, Any] | None, timeout: float
) -> list[str]:
    """The command line of one scenario of a driver (its own deadline is `timeout`)."""
    return [
        str(python),
        str(peers.PEER_SCRIPTS / script),
        "--url",
        url,
        "--scenario",
        scenario,
        "--timeout",
        str(timeout),
        "--args",
        json.dumps(args or {}),
    ]


def legacy_client_argv(url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> list[str]:
    return driver_argv(peers.mcp1_python(), "legacy_client.py", url, scenario, args, timeout)


def modern_client_argv(url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> list[str]:
    return driver_argv(peers.mcp2_python(), "modern_client.py", url, scenario, args, timeout)


def modern_task_client_argv(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> list[str]:
    return driver_argv(peers.mcp2_python(), "modern_task_client.py", url, scenario, args, timeout)


PROGRESS_LINE = "DRIVER-PROGRESS"  # what a driver writes on stderr at each progress notification


def started(argv: list[str]) -> subprocess.Popen[str]:
    """A driver started by the test itself (to act while it runs): its stdout and stderr piped."""
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def until_progress(driver: subprocess.Popen[str], timeout: float) -> None:
    """Wait until `driver` (see `started`) saw its first progress notification: its call runs
    upstream. The rest of its stderr is kept for `finished`."""
    assert driver.stderr is not None
    seen: queue.Queue[str] = queue.Queue()
    kept: list[str] = []

    def read() -> None:
        assert driver.stderr is not None
        for line in driver.stderr:
            kept.append(line)
            if line.startswith(PROGRESS_LINE):
                seen.put(line)
        seen.put("")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    driver.kept_stderr = (reader, kept)  # type: ignore[attr-defined]
    try:
        line = seen.get(timeout=timeout)
    except queue.Empty:
        raise TimeoutError(f"the driver saw no progress within {timeout}s") from None
    if not line:
        raise AssertionError(f"the driver ended before any progress (exit {driver.wait()}):\n{''.join(kept)[-3000:]}")


def finished(driver: subprocess.Popen[str], timeout: float) -> dict[str, Any]:
    """The observations of a driver started with `started`, once it ends (bounded)."""
    try:
        stdout = driver.stdout.read() if driver.stdout is not None else ""
        driver.wait(timeout)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    reader, kept = getattr(driver, "kept_stderr", (None, []))
    if reader is not None:
        reader.join(10)
    stderr = "".join(kept) if reader is not None else (driver.stderr.read() if driver.stderr else "")
    for pipe in (driver.stdout, driver.stderr):
        if pipe is not None:
            pipe.close()
    return observations(driver.returncode, stdout, stderr)


def observations(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    """What a driver printed: its last stdout line (observations or its error), exit status, stderr."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise AssertionError(f"driver printed nothing (exit {returncode}); stderr:\n{stderr[-3000:]}")
    observed: dict[str, Any] = json.loads(lines[-1])
    observed["_exit"] = returncode
    observed["_stderr"] = stderr[-3000:]
    return observed


class DriverPool:
    """The warm start of one SDK virtualenv's drivers (tests/e2e/peers/driver_pool.py): started at
    first use in this test process, it forks each run from a process that imported the SDK once.
    Thread-safe (the replica suite runs drivers from a thread pool)."""

    def __init__(self, python: Callable[[], Path], modules: tuple[str, ...]) -> None:
        self._python = python
        self._modules = modules
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._jobs: dict[int, dict[str, Any]] = {}
        self._changed = threading.Condition()
        self._next = iter(range(1, 1_000_000_000))
        self._folder = Path(tempfile.mkdtemp(prefix="sdk-drivers-"))
        atexit.register(self.close)

    def _started(self) -> subprocess.Popen[str]:
        if self._process is None or self._process.poll() is not None:
            argv = [str(self._python()), str(peers.PEER_SCRIPTS / "driver_pool.py"), *self._modules]
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
            )
            threading.Thread(target=self._read, args=(self._process,), daemon=True).start()
        return self._process

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            message = json.loads(line)
            with self._changed:
                self._jobs.setdefault(message["job"], {}).update(message)
                self._changed.notify_all()
        with self._changed:  # the pool is gone: nothing more will be told
            for job in self._jobs.values():
                job.setdefault("exit", None)
            self._changed.notify_all()

    def _wait(self, job: int, key: str, timeout: float) -> Any:
        with self._changed:
            self._changed.wait_for(lambda: key in self._jobs.get(job, {}), timeout)
            return self._jobs.get(job, {}).get(key)

    def run(self, module: str, argv: list[str], timeout: float) -> tuple[int, str, str]:
        """One run of `module` with `argv`: (exit status, stdout, stderr), as subprocess.run gives;
        subprocess.TimeoutExpired past `timeout`, its process group killed."""
        job = next(self._next)
        out, err = self._folder / f"{job}.out", self._folder / f"{job}.err"
        request = {"job": job, "module": module, "argv": argv, "stdout": str(out), "stderr": str(err)}
        with self._lock:
            process = self._started()
            assert process.stdin is not None
            with self._changed:
                self._jobs[job] = {}
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
        try:
            pid = self._wait(job, "pid", 30)
            if pid is None:
                raise RuntimeError(f"the {module} driver pool did not start the run")
            code = self._wait(job, "exit", timeout)
            if code is None and "exit" not in self._jobs[job]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                self._wait(job, "exit", 10)
                raise subprocess.TimeoutExpired([module, *argv], timeout)
            if code is None:
                raise RuntimeError(f"the {module} driver pool ended during the run")
            return code, out.read_text(errors="replace"), err.read_text(errors="replace")
        finally:
            with self._changed:
                self._jobs.pop(job, None)
            out.unlink(missing_ok=True)
            err.unlink(missing_ok=True)

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()  # the pool ends, killing what still runs
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(10)
        shutil.rmtree(self._folder, ignore_errors=True)


POOLS = {
    "legacy_client.py": DriverPool(peers.mcp1_python, ("legacy_client",)),
    "modern_client.py": (mcp2 := DriverPool(peers.mcp2_python, ("modern_client", "modern_task_client"))),
    "modern_task_client.py": mcp2,
}


def _run(argv: list[str], timeout: float) -> dict[str, Any]:
    """One driver run (a command line of `driver_argv`), forked from its SDK's warm pool."""
    script = Path(argv[1]).name
    code, stdout, stderr = POOLS[script].run(script.removesuffix(".py"), argv[2:], timeout + 15)
    return observations(code, stdout, stderr)


def run_legacy_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==1.30.0 driver; returns its observations (or its error)."""
    return _run(legacy_client_argv(url, scenario, args, timeout), timeout)


def run_modern_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==2.3.0 driver (2026-07-28 mode); returns its observations."""
    return _run(modern_client_argv(url, scenario, args, timeout), timeout)


def run_modern_task_client(
    url: str, scenario: str, args: dict[str, Any] | None = None, timeout: float = 30.0
) -> dict[str, Any]:
    """Run one scenario of the mcp==2.3.0 tasks-extension driver; returns its observations."""
    return _run(modern_task_client_argv(url, scenario, args, timeout), timeout)


def run_node_host(script: str, spec: dict[str, Any], timeout: float = 90.0) -> dict[str, Any]:
    """One run of a Node host of tests/e2e/peers (apps_host.cjs, skills_host.cjs, ...) given its JSON
    `spec`: what it printed on its last stdout line, which must not be an error."""
    done = subprocess.run(
        ["node", str(peers.PEER_SCRIPTS / script), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, **peers.node_env()},
    )
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise AssertionError(f"{script} printed nothing (exit {done.returncode}):\n{done.stderr[-3000:]}")
    observed: dict[str, Any] = json.loads(lines[-1])
    assert "error" not in observed, observed
    return observed
