"""Log lines (proxy/logs.py): one JSON object per line, whatever a client put in the logged values;
a stream that is closed, full or failing costs lines (counted), never the caller."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import structlog

from proxy import logs
from proxy.logs import _dumps

WAIT = 10.0  # upper bound for anything a test waits for


def test_a_value_that_is_not_valid_unicode_is_written_as_its_json_escape():
    # aiohttp decodes header bytes that are not UTF-8 with surrogate escapes (Origin: http://\xff).
    line = _dumps({"event": "origin_rejected", "origin": "http://\udcff", "host": "é"})
    assert json.loads(line) == {"event": "origin_rejected", "origin": "http://\udcff", "host": "é"}
    assert b"\\udcff" in line and "é".encode() in line


def test_integers_beyond_64_bits_and_other_objects_are_written_too():
    line = _dumps({"event": "x", "n": 10**30, "other": object()})
    decoded = json.loads(line)
    assert decoded["n"] == 10**30 and decoded["other"].startswith("<object")


# ---------------------------------------------------------------- the sink: lines cost, never answers


@dataclass
class StderrPipe:
    """A pipe standing in for stderr: its read end, its write end."""

    read_end: int
    write_end: int
    monkeypatch: pytest.MonkeyPatch

    def configure(self, **settings: Any) -> None:
        """The proxy's logging, configured with this pipe as stderr. (Set here, in the test's own
        call: pytest puts its own capture back in sys.stderr between the fixtures and the test.)"""
        self.monkeypatch.setattr("sys.stderr", os.fdopen(self.write_end, "w", closefd=False))
        logs.configure_logging("info", "json", **settings)


@pytest.fixture
def stderr_pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[StderrPipe]:
    """The logging configured in the test is stopped and structlog's defaults are back afterwards."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # fills after a few lines
    try:
        yield StderrPipe(read_end, write_end, monkeypatch)
    finally:
        logs.stop()
        structlog.reset_defaults()
        for fd in (read_end, write_end):
            with contextlib.suppress(OSError):
                os.close(fd)


def log_requests(count: int) -> None:
    log = structlog.get_logger("test")
    for index in range(count):
        log.info("request", method="tools/call", outcome="ok", index=index)


def read_to_end(fd: int) -> list[dict[str, object]]:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return [json.loads(line) for line in b"".join(chunks).splitlines()]


def test_a_closed_stream_costs_the_lines_not_the_caller(stderr_pipe: StderrPipe) -> None:
    """stderr a pipe whose reader is gone (`proxy | tee` after tee ended): logging goes on without
    an error, and every line is counted lost (nothing can say so on that stream)."""
    os.close(stderr_pipe.read_end)
    before = logs.lines_lost()
    stderr_pipe.configure()
    log_requests(100)
    assert logs.flush(WAIT)
    log_requests(100)  # after the writer found the pipe closed: dropped at once
    assert logs.flush(WAIT)
    assert logs.lines_lost() - before == 200


def test_a_full_stream_does_not_block_the_caller_and_the_loss_is_said_once_after_it(
    stderr_pipe: StderrPipe,
) -> None:
    """A reader that does not read (a full pipe): logging past the queue returns at once (the
    lines beyond it are dropped and counted); once the reader reads again, the lines that waited
    come out, then one `log_lines_lost` line with the count."""
    total = 2 * logs.QUEUE_LINES + 1000  # the queue, and as much again in the writer's hands
    before = logs.lines_lost()
    stderr_pipe.configure()
    caller = threading.Thread(target=log_requests, args=(total,), daemon=True)
    caller.start()
    caller.join(WAIT)
    reader = ThreadPoolExecutor(1)
    try:
        assert not caller.is_alive(), "logging blocked on a full stream"
    finally:
        lines = reader.submit(read_to_end, stderr_pipe.read_end)  # the reader is back
        logs.stop()  # what waited is written
        os.close(stderr_pipe.write_end)  # the end of the stream: the reader's EOF
        written = lines.result(WAIT)
        reader.shutdown()
    lost = logs.lines_lost() - before
    requests = [line for line in written if line["event"] == "request"]
    [notice] = [line for line in written if line["event"] == "log_lines_lost"]
    assert lost >= 900 and len(requests) + lost == total
    assert notice["lines"] == lost and notice["level"] == "error" and notice["log"] == "stderr"
    assert written.index(notice) == len(requests)  # where the first line dropped would have been
    assert [line["index"] for line in requests] == list(range(len(requests)))  # in order, a gap only at the end


def test_a_log_file_that_fails_is_said_once_on_stderr_and_every_line_counted(
    stderr_pipe: StderrPipe,
) -> None:
    before = logs.lines_lost()
    stderr_pipe.configure(file="/dev/full")  # every write: ENOSPC
    log_requests(30)
    assert logs.flush(WAIT)
    log_requests(20)
    logs.stop()
    os.close(stderr_pipe.write_end)
    said = read_to_end(stderr_pipe.read_end)
    assert logs.lines_lost() - before == 50
    [notice] = said
    assert notice["event"] == "log_lines_lost" and notice["log"] == "/dev/full"
    assert "No space left on device" in str(notice["reason"]) and 1 <= int(notice["lines"]) <= 30  # type: ignore[call-overload]


def test_the_lines_written_reach_the_stream_in_order_as_json(stderr_pipe: StderrPipe) -> None:
    before = logs.lines_lost()
    stderr_pipe.configure(worker=2)
    with ThreadPoolExecutor(1) as reader:
        lines = reader.submit(read_to_end, stderr_pipe.read_end)
        log_requests(3000)  # more than the pipe holds: the reader keeps up
        logs.stop()
        os.close(stderr_pipe.write_end)
        written = lines.result(WAIT)
    assert [line["index"] for line in written] == list(range(3000))
    assert all(line["worker"] == 2 and line["level"] == "info" for line in written)
    assert logs.lines_lost() == before


def test_lines_are_written_in_runs_a_pipe_takes_whole() -> None:
    """At most PIPE_BUF bytes a write, whole lines (a longer one alone): the lines of processes
    sharing the pipe (--workers) are never cut into one another."""
    lines = [b"x" * size for size in (100, 3000, 990, 5000, 10, 4095, 4094, 0, 7)]
    chunks = logs._chunks(lines)
    assert [line for chunk in chunks for line in chunk] == lines
    for chunk in chunks:
        written = sum(len(line) + 1 for line in chunk)
        assert written <= logs.PIPE_BUF or len(chunk) == 1, [len(line) for line in chunk]
    assert [len(chunk) for chunk in chunks] == [3, 1, 1, 1, 2, 1]  # 4093, 5001, 11, 4096, 4096, 8 bytes
