"""Log lines (proxy/logs.py): one JSON object per line, whatever a client put in the logged values."""

from __future__ import annotations

import json

from proxy.logs import _dumps


def test_a_value_that_is_not_valid_unicode_is_written_as_its_json_escape():
    # aiohttp decodes header bytes that are not UTF-8 with surrogate escapes (Origin: http://\xff).
    line = _dumps({"event": "origin_rejected", "origin": "http://\udcff", "host": "é"})
    assert json.loads(line) == {"event": "origin_rejected", "origin": "http://\udcff", "host": "é"}
    assert b"\\udcff" in line and "é".encode() in line


def test_integers_beyond_64_bits_and_other_objects_are_written_too():
    line = _dumps({"event": "x", "n": 10**30, "other": object()})
    decoded = json.loads(line)
    assert decoded["n"] == 10**30 and decoded["other"].startswith("<object")
