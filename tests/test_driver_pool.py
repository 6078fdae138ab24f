"""The SDK drivers' warm start (tests/e2e/peers/driver_pool.py, driven by tests/support/sdk_drivers.py),
with a stand-in driver: every job it is sent gets its run, however many arrive together."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from tests.support.peers import PEER_SCRIPTS

STAND_IN = """
import sys


def main() -> int:
    print("ran", *sys.argv[1:])
    return 0
"""
JOBS = (1, 2, 3)


def test_jobs_written_together_each_start_and_end(tmp_path: Path) -> None:
    shutil.copy(PEER_SCRIPTS / "driver_pool.py", tmp_path / "driver_pool.py")
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    pool = subprocess.Popen(
        [sys.executable, str(tmp_path / "driver_pool.py"), "stand_in"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert pool.stdin is not None and pool.stdout is not None
    answers: queue.Queue[str] = queue.Queue()
    stdout = pool.stdout

    def read() -> None:
        for line in stdout:
            answers.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        # One write: the pool takes them in at once, and the later ones must not wait behind the first.
        pool.stdin.write(
            "".join(
                json.dumps(
                    {
                        "job": n,
                        "module": "stand_in",
                        "argv": [str(n)],
                        "stdout": str(tmp_path / f"{n}.out"),
                        "stderr": "/dev/null",
                    }
                )
                + "\n"
                for n in JOBS
            )
        )
        pool.stdin.flush()
        seen: dict[int, dict[str, int]] = {}
        while not all("exit" in seen.get(n, {}) for n in JOBS):
            message = json.loads(answers.get(timeout=10))  # queue.Empty: a job that never started
            seen.setdefault(message["job"], {}).update(message)
        assert all(seen[n]["pid"] > 0 and seen[n]["exit"] == 0 for n in JOBS)
        assert [(tmp_path / f"{n}.out").read_text() for n in JOBS] == [f"ran {n}\n" for n in JOBS]
    finally:
        pool.stdin.close()  # the pool ends with its input
        pool.wait(10)
        reader.join(10)
        pool.stdout.close()
