"""Plain values crossing the core's edge (proxy/protocol/outcome.py) and which resources an update
concerns (proxy/protocol/methods.py `uri_within`; docs/translation.md §4.6 step 6, §5)."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.protocol import jsonrpc
from proxy.protocol.methods import uri_within
from proxy.protocol.outcome import Outcome, UpstreamFailure, invalid, timed_out

# ---------------------------------------------------------------- Outcome


def test_an_outcome_is_a_shareable_200_unless_told_otherwise():
    message = jsonrpc.result_response(1, {"resultType": "complete"})
    assert Outcome(message) == Outcome(message, 200, True)
    assert Outcome(message, 400, False).status == 400
    assert not Outcome(message, shareable=False).shareable


# ---------------------------------------------------------------- UpstreamFailure


@pytest.mark.parametrize(
    ("upstream", "detail", "message"),
    [
        ("weather", "timed out", "upstream 'weather' timed out"),
        ("up", "is unreachable (connection refused)", "upstream 'up' is unreachable (connection refused)"),
        ("it's", "answered 502", 'upstream "it\'s" answered 502'),
    ],
)
def test_the_message_names_the_upstream_then_what_happened(upstream, detail, message):
    failure = UpstreamFailure(upstream, "unavailable", jsonrpc.UPSTREAM_UNAVAILABLE, detail)
    assert failure.message == message


@pytest.mark.parametrize(("status", "auth"), [(401, True), (403, True), (None, False), (400, False), (404, False)])
def test_only_a_401_or_403_is_an_authentication_failure(status, auth):
    failure = UpstreamFailure("up", "http", jsonrpc.UPSTREAM_INVALID, f"answered {status}", http_status=status)
    assert failure.is_auth is auth


@pytest.mark.parametrize("status", [402, 407, 500, 503])
def test_other_http_statuses_are_not_authentication_failures(status):
    failure = UpstreamFailure("up", "http", jsonrpc.UPSTREAM_UNAVAILABLE, "x", status, 'Bearer realm="x"')
    assert not failure.is_auth


def test_a_timeout_is_counted_as_timeout_and_reported_with_the_timeout_code():
    failure = timed_out("weather")
    assert failure == UpstreamFailure("weather", "timeout", jsonrpc.UPSTREAM_TIMEOUT, "timed out")
    assert failure.message == "upstream 'weather' timed out"
    assert (failure.http_status, failure.www_authenticate) == (None, None)
    assert not failure.is_auth


def test_an_invalid_answer_is_counted_as_invalid_and_reported_with_the_invalid_code():
    failure = invalid("weather", "sent a result that is not an object")
    assert failure == UpstreamFailure(
        "weather", "invalid", jsonrpc.UPSTREAM_INVALID, "sent a result that is not an object"
    )
    assert failure.message == "upstream 'weather' sent a result that is not an object"
    assert not failure.is_auth


def test_an_upstream_failure_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        timed_out("up").code = jsonrpc.INTERNAL_ERROR  # type: ignore[misc]


# ---------------------------------------------------------------- uri_within


@pytest.mark.parametrize(
    ("uri", "updated", "within"),
    [
        ("mem://docs", "mem://docs", True),
        ("mem://docs/a", "mem://docs", True),
        ("mem://docs/a/b", "mem://docs", True),
        ("mem://docs/a", "mem://docs/", True),
        ("file:///tmp/x", "file:///tmp/", True),
        ("mem://docs/", "mem://docs/", True),
        ("mem://docsx", "mem://docs", False),
        ("mem://doc", "mem://docs", False),
        ("mem://docs", "mem://docs/a", False),
        ("mem://other/docs", "mem://docs", False),
        ("file://docs/a", "mem://docs", False),
    ],
)
def test_an_update_concerns_the_resource_itself_and_those_below_it(uri, updated, within):
    assert uri_within(uri, updated) is within
