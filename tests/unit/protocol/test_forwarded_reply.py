"""The legacy client's reply to a finished forwarded call (proxy/protocol/forwarded_reply.py;
docs/translation.md §3.4-§3.6)."""

from __future__ import annotations

import pytest

from proxy.protocol import jsonrpc
from proxy.protocol.forwarded_actions import Finish
from proxy.protocol.forwarded_reply import final_message, final_reply, outcome_message
from proxy.protocol.versions import LATEST_LEGACY
from tests.unit.protocol.test_forwarded_call import TEXT, TOOLS_CALL, complete


def test_the_final_reply_is_the_result_downgraded_for_the_client_revision_under_its_id():
    finish = Finish(result=complete(content=TEXT, ttlMs=5, cacheScope="public"), cacheable=True)
    reply_ = outcome_message(finish)
    assert reply_ == {"jsonrpc": "2.0", "result": finish.result}
    assert final_message(TOOLS_CALL, reply_, LATEST_LEGACY) == jsonrpc.result_response(7, {"content": TEXT})


def test_the_final_reply_of_a_failed_call_is_its_error_under_the_clients_id():
    finish = Finish(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "boom"))
    assert final_message(TOOLS_CALL, outcome_message(finish), LATEST_LEGACY) == jsonrpc.error_response(
        7, jsonrpc.INTERNAL_ERROR, "boom"
    )
    assert outcome_message(Finish()) == {"jsonrpc": "2.0", "result": {}}


def test_an_error_that_is_no_object_is_not_relayed_as_an_error():
    reply_ = {"jsonrpc": "2.0", "error": "boom", "result": complete(content=TEXT)}
    assert final_message(TOOLS_CALL, reply_, LATEST_LEGACY) == jsonrpc.result_response(7, {"content": TEXT})


@pytest.mark.parametrize(
    "finish",
    [
        Finish(result=complete(content=TEXT, ttlMs=5, cacheScope="public"), cacheable=True),
        Finish(error=jsonrpc.error_object(jsonrpc.INTERNAL_ERROR, "boom")),
        Finish(),
    ],
)
def test_the_final_reply_in_one_step_is_the_same_as_through_the_outcome(finish):
    assert final_reply(TOOLS_CALL, finish, LATEST_LEGACY) == final_message(
        TOOLS_CALL, outcome_message(finish), LATEST_LEGACY
    )
