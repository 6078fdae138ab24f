"""Runs a module as `python -m` would, counting the Python bytecodes each function executes between
SIGUSR1 (start) and SIGUSR2 (stop: the counts are written to OUT as JSON).

    python -m bench.opcount OUT MODULE [ARGS...]

A count of work that does not depend on how busy the machine is (bench/instructions.py): the same
requests through the same code execute the same bytecodes, so two revisions compare exactly, where
CPU time on a shared machine moves by ±10 %. Every function is traced while counting (about 50 times
slower), so only counts come out of it, never time. Keys are "file:line:qualname", the file relative
to site-packages or the working directory; a dataclass's generated __init__ (all named "<string>")
is keyed by its caller too, so that it says which class was built.
"""

from __future__ import annotations

import collections
import json
import os
import runpy
import signal
import sys
from types import CodeType, FrameType
from typing import Any

_counts: collections.Counter[str] = collections.Counter()
_keys: dict[CodeType, str] = {}
_cwd = os.getcwd() + os.sep


def _where(code: CodeType) -> str:
    name = code.co_filename.split("site-packages" + os.sep)[-1].removeprefix(_cwd)
    return f"{name}:{code.co_firstlineno}:{code.co_qualname}"


def _tracer(frame: FrameType, event: str, arg: Any) -> Any:
    if event != "call":
        return None
    frame.f_trace_opcodes = True
    code = frame.f_code
    key = _keys.get(code)
    if key is None:
        key = _keys[code] = _where(code)
    if key.startswith("<string>") and frame.f_back is not None:
        key += " <- " + _where(frame.f_back.f_code)
    counts = _counts

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[key] += 1
        return local

    return local


def main() -> None:
    out, module = sys.argv[1], sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or ".") == here:  # run as a file: import as -m would
        sys.path[0] = os.getcwd()

    def start(*_: object) -> None:
        _counts.clear()
        sys.settrace(_tracer)

    def stop(*_: object) -> None:
        sys.settrace(None)
        tmp = out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(dict(_counts), f)
        os.replace(tmp, out)  # whole or absent: the reader waits for it

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
