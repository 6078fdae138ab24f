"""The actions both call machines return, defined once (proxy/protocol/actions.py) and importable
from each machine's module, where the drivers import them."""

from __future__ import annotations

import dataclasses
from types import ModuleType

import pytest

from proxy.protocol import actions, forwarded_actions, forwarded_call, parked_call
from proxy.protocol.outcome import invalid
from tests.unit.protocol import test_forwarded_call as forwarded
from tests.unit.protocol import test_parked_call as parked

FAILURE = invalid("up", "ended the response stream without a response")


@pytest.mark.parametrize("module", [forwarded_actions, forwarded_call, parked_call], ids=lambda m: m.__name__)
def test_each_machine_module_re_exports_the_shared_actions_themselves(module: ModuleType) -> None:
    assert module.RelayToClient is actions.RelayToClient
    assert module.Fail is actions.Fail
    assert {"RelayToClient", "Fail"} <= set(module.__all__)


@pytest.mark.parametrize("module", [forwarded_actions, forwarded_call, parked_call], ids=lambda m: m.__name__)
def test_every_name_a_machine_module_exports_is_there(module: ModuleType) -> None:
    missing = [name for name in module.__all__ if not hasattr(module, name)]
    assert not missing


def test_the_forwarded_call_module_exports_its_actions_and_final_reply() -> None:
    assert set(forwarded_actions.__all__) <= set(forwarded_call.__all__)
    assert {"final_reply", "final_message", "outcome_message", "ForwardedCall"} <= set(forwarded_call.__all__)


def test_the_shared_actions_are_frozen_values() -> None:
    note = actions.RelayToClient({"jsonrpc": "2.0", "method": "notifications/progress"})
    assert note == actions.RelayToClient({"jsonrpc": "2.0", "method": "notifications/progress"})
    assert actions.Fail(FAILURE) == actions.Fail(FAILURE)
    with pytest.raises(dataclasses.FrozenInstanceError):
        note.message = {}


def test_both_machines_fail_with_the_one_fail_action() -> None:
    call = forwarded.new()
    forwarded.started(call)
    assert call.upstream_ended()[-1] == actions.Fail(FAILURE)
    assert parked.new().upstream_ended()[-1] == actions.Fail(FAILURE)
