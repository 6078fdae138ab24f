"""A warm start for the SDK scenario drivers of this folder: one process per SDK virtualenv that has
imported the drivers (the SDK, pydantic, httpx: most of a driver's CPU) and forks a fresh child
for each run. The child is the driver as its command line would run it (`sys.argv` set, `main()`
called, stdin /dev/null, stdout and stderr to the files the job names, its own session so the
caller can kill its process group); only the import is paid once.

    driver_pool.py MODULE [MODULE ...]     (e.g. legacy_client; run with that SDK's interpreter)

Jobs, one JSON object per line on stdin: {"job": N, "module": M, "argv": [...], "stdout": PATH,
"stderr": PATH}; answers on stdout: {"job": N, "pid": PID} once forked, {"job": N, "exit": CODE}
once it ended (CODE negative: the signal that killed it). End of stdin: the pool ends, killing
what still runs. Free of any SDK but the drivers it loads; tests/support/sdk_drivers.py drives it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import selectors
import signal
import sys
from types import ModuleType
from typing import Any


def child(module: ModuleType, job: dict[str, Any], closing: list[int]) -> None:
    """In the forked child: become the driver's own process and never return."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(job["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(job["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for source, target in ((null, 0), (out, 1), (err, 2)):
            os.dup2(source, target)
            os.close(source)
        sys.argv = [str(module.__file__), *job["argv"]]
        code = module.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # exiting anyway
                stream.flush()
        os._exit(code if isinstance(code, int) else 1)


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)
    modules = {name: importlib.import_module(name) for name in sys.argv[1:]}
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wakeup fd is written
    # Read from the descriptor itself: a buffered reader may take in several jobs at once, and the
    # ones behind the first would wait in its buffer, unseen by select, until more bytes come.
    jobs_in = sys.stdin.fileno()
    unread = b""
    answers = sys.stdout
    running: dict[int, int] = {}  # pid -> job

    def answer(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    def reap() -> None:
        while running:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = running.pop(pid, None)
            if job is not None:
                answer({"job": job, "exit": os.waitstatus_to_exitcode(status)})

    selector = selectors.DefaultSelector()
    selector.register(jobs_in, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    try:
        while True:
            for key, _ in selector.select():
                if key.fileobj == wake_read:
                    os.read(wake_read, 4096)
                    reap()
                    continue
                data = os.read(jobs_in, 65536)
                if not data:
                    return 0
                *lines, unread = (unread + data).split(b"\n")
                for line in lines:
                    job = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        child(modules[job["module"]], job, [wake_read, wake_write, selector.fileno()])
                    running[pid] = job["job"]
                    answer({"job": job["job"], "pid": pid})
                    reap()  # a child that ended before it was registered
    finally:
        for pid in running:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main())
