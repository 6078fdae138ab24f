"""resource_server's binding of a same-era upstream's state to the caller (proxy/relay/binding.py)."""

from __future__ import annotations

from proxy.protocol import jsonrpc
from proxy.protocol.request_state import PURPOSE as PROXY_STATE_PURPOSE
from proxy.relay.binding import CallerBinding
from proxy.state.sealing import Sealer

SECRET = b"s" * 32
ALICE, BOB = "iss:alice", "iss:bob"


def test_a_session_id_opens_for_its_caller_only_on_any_replica():
    token = CallerBinding(Sealer(SECRET)).seal_session("upstream-sid", ALICE)
    other_replica = CallerBinding(Sealer(SECRET))
    assert other_replica.open_session(token, ALICE) == "upstream-sid"
    assert other_replica.open_session(token, BOB) is None
    assert other_replica.open_session("upstream-sid", ALICE) is None  # the upstream's own is no token
    assert CallerBinding(Sealer(b"t" * 32)).open_session(token, ALICE) is None
    # A session token is no requestState, nor the other way round.
    assert other_replica.open_state(token, ALICE) is None


def test_the_proxys_own_request_state_is_not_an_upstreams():
    sealer = Sealer(SECRET)
    own = sealer.seal(PROXY_STATE_PURPOSE, b"claims", ALICE.encode())
    assert CallerBinding(sealer).open_state(own, ALICE) is None


def test_a_reply_gets_each_results_request_state_sealed_and_the_retry_gets_it_back():
    binding = CallerBinding(Sealer(SECRET))
    parked = jsonrpc.result_response(1, {"resultType": "input_required", "requestState": "up-1"})
    done = jsonrpc.result_response(2, {"resultType": "complete"})
    assert binding.reply(done, ALICE) is None and binding.reply([done], ALICE) is None
    [sealed, kept] = binding.reply([parked, done], ALICE)
    assert kept is done and sealed["result"]["requestState"] != "up-1"
    retry = jsonrpc.request(3, "tools/call", {"name": "x", "requestState": sealed["result"]["requestState"]})
    opened = binding.request(retry, ALICE)
    assert opened is not None and opened[1] and opened[0]["params"]["requestState"] == "up-1"
    assert binding.request(retry, BOB) is None
    plain = jsonrpc.request(4, "tools/call", {"name": "x"})
    assert binding.request(plain, BOB) == (plain, False)  # nothing to open: it goes as it came


def test_an_upstream_request_state_of_any_size_a_body_can_carry_opens():
    binding = CallerBinding(Sealer(SECRET), max_state_chars=1 << 20)
    large = "x" * 100_000  # sealed, far over the proxy's own tokens' bound
    sealed = binding.reply(jsonrpc.result_response(1, {"requestState": large}), ALICE)["result"]["requestState"]
    assert binding.open_state(sealed, ALICE) == large
    assert CallerBinding(Sealer(SECRET), max_state_chars=1000).open_state(sealed, ALICE) is None
