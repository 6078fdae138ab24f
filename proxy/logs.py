"""Structured logging: one JSON object per line on stderr (stdout may carry MCP over stdio), or in
`logging.file`.

A log line never fails a request nor holds up the event loop: the thread that logs only puts the
rendered line in a bounded queue (`LogSink`), and one thread of its own writes the queue out with
plain blocking writes. A reader that does not keep up (a full pipe) or a stream that fails (a pipe
whose reader is gone, a full disk) costs lines, not answers: each line lost is counted
(`lines_lost`, exported as mcp_era_proxy_log_lines_lost_total) and the first loss is said once on
stderr, when stderr can still be written.

Why a thread rather than non-blocking writes on the event loop: stderr's open file description is
shared with whoever started the proxy (a terminal, the pipe of `| tee`, a container runtime's),
and O_NONBLOCK set on it would make that parent's own writes fail with EAGAIN.
"""

from __future__ import annotations

import atexit
import errno
import json
import logging
import os
import select
import sys
import threading
from collections import deque
from collections.abc import Callable, MutableMapping
from typing import Any, TextIO

import orjson
import structlog

# Lines waiting to be written before more are dropped (a request line is about 250 bytes).
QUEUE_LINES = 8192
# Once woken, the writer waits this long for more lines before it writes them all at once.
GATHER_S = 0.005
PIPE_BUF = select.PIPE_BUF  # what a pipe writes whole, never interleaved with another writer's (4096 on Linux)
# At exit, what is still queued gets this long to be written (a reader that stalls must not hold
# the process).
EXIT_FLUSH_S = 2.0
LOST_METRIC = "mcp_era_proxy_log_lines_lost_total"  # the metric app.py exports lines_lost() as


def _dumps(event: dict[str, Any], **_: Any) -> bytes:
    """orjson where it can (a line per request at the info level: it is on the hot path), the
    standard library where it cannot (integers beyond 64 bits, text that is not valid Unicode such
    as a header's undecodable bytes); anything else as its repr. A log line never fails to write:
    a lone surrogate becomes its JSON escape."""
    try:
        return orjson.dumps(event, default=repr)
    except TypeError:
        text = json.dumps(event, default=repr, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8", "backslashreplace")


class _Gap:
    """Where the first line dropped for a full queue would have been: the notice is said there."""


_GAP = _Gap()


class LogSink:
    """A log stream written by a thread of its own. `write` (any thread) never blocks and never
    raises: the line is queued, or dropped and counted when `capacity` lines wait already or the
    stream is gone for good. The writer is woken when a line comes to an empty queue, and gathers
    what comes for GATHER_S before it writes: a busy proxy pays for one wake-up per GATHER_S and
    one write per PIPE_BUF bytes of lines, not one per line. It counts the lines a failed write
    lost. The first loss is said once (`notice`) on `notice_fd`: where the lines were lost when
    that is the log's own stream (in the place of the first line dropped, or at the first write
    that goes through after one that failed), at once when it is another (a log file that fails,
    said on stderr). A pipe whose reader is gone (EPIPE) is not written again."""

    def __init__(
        self,
        output: int | TextIO,
        *,
        capacity: int = QUEUE_LINES,
        notice: Callable[[int, str], bytes] | None = None,
        notice_fd: int | None = None,
        owns_output: bool = False,
    ) -> None:
        self._output = output
        self._owns_output = owns_output  # a file it opened: closed with it
        self._capacity = capacity
        self._notice = notice
        self._notice_fd = notice_fd
        # Lines; flush marks; _GAP; None, the end. append and popleft are atomic.
        self._lines: deque[bytes | threading.Event | _Gap | None] = deque()
        # A binary semaphore (released: the writer is wanted), lighter than threading.Event, whose
        # Condition is Python code: a lock released by `_signal`, taken by the writer.
        self._wake = threading.Lock()
        self._wake.acquire()
        self._hurry = capacity // 4  # this many lines waiting end the writer's gathering at once
        self._idle = False  # the writer waits on `_wake`: the next line signals it
        self._drop_lock = threading.Lock()  # only the rare dropping path takes it
        self._dropped = 0  # by `write`: the queue full, or the stream gone
        self._failed = 0  # by the writer: lines a failed write did not deliver
        self._gap_marked = False
        self._gone = False
        self._said = False
        self._unsaid_failure = False
        self._reason = ""
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> int:
        return self._dropped + self._failed

    def write(self, line: bytes) -> None:
        """Queue one line (without its newline)."""
        waiting = len(self._lines)
        if self._gone or waiting >= self._capacity:
            self._drop()
            return
        self._lines.append(line)
        if self._idle or waiting == self._hurry:
            self._idle = False
            self._signal()

    def _drop(self) -> None:
        with self._drop_lock:
            self._dropped += 1
            if not self._gap_marked and not self._gone:
                self._gap_marked = True
                self._reason = self._reason or f"the log stream did not keep up ({self._capacity} lines were waiting)"
                self._lines.append(_GAP)  # past the bound: it is one marker, once

    def flush(self, timeout: float) -> bool:
        """Wait (at most `timeout`) until the lines queued before this call are written or lost."""
        if not self._thread.is_alive():
            return True
        done = threading.Event()
        self._enqueue(done)
        return done.wait(timeout)

    def close(self, timeout: float) -> None:
        """Write what is queued (at most `timeout`), then stop the writer; later lines are dropped."""
        if self._thread.is_alive():
            self._enqueue(None)
            self._thread.join(timeout)
        self._gone = True
        if self._owns_output and isinstance(self._output, int) and not self._thread.is_alive():
            os.close(self._output)

    def _enqueue(self, item: threading.Event | None) -> None:
        self._lines.append(item)
        self._idle = False
        self._signal()

    def _signal(self) -> None:
        try:
            self._wake.release()
        except RuntimeError:  # released already: the writer is wanted anyway
            pass

    def _run(self) -> None:
        lines = self._lines
        while True:
            if not lines:
                self._idle = True
                if not lines:  # looked at again once `_idle` is set: a line queued meanwhile is seen
                    self._wake.acquire()
                self._idle = False
            self._wake.acquire(blocking=False)  # a signal given meanwhile is taken now
            if len(lines) < self._hurry:
                self._wake.acquire(timeout=GATHER_S)  # ended early by `hurry` or a flush
            batch: list[bytes] = []
            marks: list[threading.Event] = []
            for _ in range(len(lines)):  # what is queued now; what comes meanwhile waits for the next round
                item = lines.popleft()
                if isinstance(item, bytes):
                    batch.append(item)
                elif isinstance(item, threading.Event):
                    marks.append(item)
                else:  # the gap, or the end: what came before it is written first
                    self._write_lines(batch)
                    batch = []
                    if item is None:
                        for mark in marks:
                            mark.set()
                        return
                    self._say()
            self._write_lines(batch)
            for mark in marks:
                mark.set()

    def _write_lines(self, batch: list[bytes]) -> None:
        if not batch:
            return
        if self._gone:
            self._failed += len(batch)
            return
        chunks = _chunks(batch)
        for index, chunk in enumerate(chunks):
            try:
                self._write_all(b"\n".join(chunk) + b"\n")
            except _Partial as partial:
                self._failed += _cut(chunk, partial.written) + sum(map(len, chunks[index + 1 :]))
                self._reason = self._reason or f"writing it failed: {partial.error}"  # the first loss's
                if partial.error.errno == errno.EPIPE:
                    self._gone = True  # the pipe's reader is gone: nothing reads it again
                self._unsaid_failure = True
                if self._notice_fd != self._fileno():
                    self._say()  # a log file that fails: said on stderr at once
                return
        if self._unsaid_failure:
            self._say()  # after the lines it lost, on the stream that lost them

    def _write_all(self, data: bytes) -> None:
        """Write all of `data`, waiting as long as it takes (_Partial if a write fails)."""
        view = memoryview(data)
        output = self._output
        try:
            if not isinstance(output, int):  # a stream object standing in for stderr
                output.write(data.decode("utf-8", "backslashreplace"))
                output.flush()
                return
            while view:
                try:
                    view = view[os.write(output, view) :]
                except BlockingIOError:  # someone set O_NONBLOCK on a description shared with us
                    select.select([], [output], [])
        except OSError as exc:
            raise _Partial(len(data) - len(view), exc) from None

    def _fileno(self) -> int | None:
        return self._output if isinstance(self._output, int) else None

    def _say(self) -> None:
        """The first loss, said once on `notice_fd` (if it can be written)."""
        if self._said or self._notice is None or self._notice_fd is None:
            return
        line = self._notice(self.lost, self._reason) + b"\n"
        try:
            if self._notice_fd == self._fileno():
                self._write_all(line)
            else:
                os.write(self._notice_fd, line)
        except (OSError, _Partial):
            return  # cannot be said there either: the metric says it
        self._said = True


class _Partial(Exception):
    """A write that failed after `written` bytes."""

    def __init__(self, written: int, error: OSError) -> None:
        super().__init__(written, error)
        self.written = written
        self.error = error


def _chunks(batch: list[bytes]) -> list[list[bytes]]:
    """The lines in runs of at most PIPE_BUF bytes with their newlines (a longer line alone): a
    pipe takes such a write whole, so that the lines of processes sharing it (the workers under
    --workers, the supervisor) are never cut into one another."""
    chunks: list[list[bytes]] = []
    size = PIPE_BUF
    for line in batch:
        if size + len(line) + 1 > PIPE_BUF:
            chunks.append([])
            size = 0
        chunks[-1].append(line)
        size += len(line) + 1
    return chunks


def _cut(batch: list[bytes], written: int) -> int:
    """How many lines of `batch` (each written with its newline) are not wholly in the first
    `written` bytes."""
    end = 0
    for delivered, line in enumerate(batch):
        end += len(line) + 1
        if end > written:
            return len(batch) - delivered
    return 0


class _SinkLogger:
    """structlog's logger for a LogSink: every level queues the rendered line."""

    __slots__ = ("_write",)

    def __init__(self, sink: LogSink) -> None:
        self._write = sink.write

    def msg(self, message: str | bytes) -> None:
        self._write(message if isinstance(message, bytes) else message.encode("utf-8", "backslashreplace"))

    log = debug = info = warn = warning = err = error = critical = exception = fatal = failure = msg


class _Worker:
    """Adds `worker: <index>` to every event."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __call__(self, logger: Any, name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        event["worker"] = self._index
        return event


class _Rendered:
    """A logger that keeps the one line it is given (the notice, rendered as every line is)."""

    line = b""

    def msg(self, message: str | bytes) -> None:
        self.line = message if isinstance(message, bytes) else message.encode("utf-8", "backslashreplace")

    error = msg


_sink: LogSink | None = None
_lost_before = 0  # by the sinks replaced since the process started


def lines_lost() -> int:
    """Log lines this process could not write, since it started."""
    return _lost_before + (_sink.lost if _sink is not None else 0)


def flush(timeout: float = EXIT_FLUSH_S) -> bool:
    """Wait (at most `timeout`) until every line logged so far is written (or counted lost)."""
    return _sink.flush(timeout) if _sink is not None else True


def stop() -> None:
    """Write what is queued (at most EXIT_FLUSH_S) and stop the writer: at exit, and before the
    logging is configured again."""
    global _sink, _lost_before
    if _sink is not None:
        _sink.close(EXIT_FLUSH_S)
        _lost_before += _sink.lost
        _sink = None


atexit.register(stop)


def configure_logging(
    level: str = "info", fmt: str = "json", worker: int | None = None, file: str | None = None
) -> None:
    """`worker`: the index of this process under --workers, put on every line it writes; `file`:
    logs are appended there instead of stderr (never stdout: it may carry MCP over stdio)."""
    global _sink
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.processors.format_exc_info,
    ]
    if worker is not None:
        processors.insert(1, _Worker(worker))
    if fmt == "json":
        processors.append(structlog.processors.JSONRenderer(serializer=_dumps))
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    stderr = _stderr()
    output = stderr if file is None else os.open(file, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)

    def notice(lost: int, reason: str) -> bytes:
        rendered = _Rendered()
        log = structlog.wrap_logger(rendered, processors=processors)
        log.error(
            "log_lines_lost",
            log=file or "stderr",
            lines=lost,
            reason=reason,
            hint=f"this is said once: {LOST_METRIC} counts every line lost",
        )
        return rendered.line

    stop()
    notice_fd = stderr if isinstance(stderr, int) else None  # where a loss is said
    _sink = LogSink(output, notice=notice, notice_fd=notice_fd, owns_output=file is not None)
    logger = _SinkLogger(_sink)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        logger_factory=lambda *_: logger,
        cache_logger_on_first_use=True,
    )


def _stderr() -> int | TextIO:
    """stderr's file descriptor, or the stream object standing in for it (tests replace it)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return sys.stderr
