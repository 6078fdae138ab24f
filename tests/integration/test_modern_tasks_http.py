"""Modern (2026-07-28) clients that declare the `io.modelcontextprotocol/tasks` extension, in front
of a legacy server whose tools run as tasks: the proxy answers their calls with a task it hosts,
and serves tasks/get, tasks/update, tasks/cancel and task notifications on a listen stream
(docs/use/tasks.md, "Tasks for 2026-07-28 clients"). Real app, scripted legacy upstream (tests/support/fake_legacy.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from proxy.protocol import jsonrpc, meta
from proxy.protocol.task_extension import EXTENSION
from tests.integration.test_modern_to_legacy_http import (  # the fixtures of that module's legacy fake too
    ACCEPTED,
    ELICIT_PARAMS,
    WAIT,
    Proxy,
    answered_after,
    fake,
    fake_server,
    make_proxy,
    proxy,
    respond_with,
    tool_result,
)
from tests.integration.test_modern_to_legacy_tasks import RELATED, RESEARCH, TASK, task_server
from tests.support.fake_legacy import Call, FakeLegacy, Outcome, error
from tests.support.mcp_client import McpReply
from tests.support.modern_client import FULL_CAPABILITIES, ModernClient
from tests.support.schema import errors

JSONDict = dict[str, Any]
__all__ = ["fake", "fake_server", "make_proxy", "proxy"]  # pytest finds fixtures by module name
TASKS = {"extensions": {EXTENSION: {}}}
ASKING = {**FULL_CAPABILITIES, **TASKS}  # can answer input, and holds tasks


def declaring(proxy: Proxy, who: str = "Bearer alice", capabilities: JSONDict = ASKING) -> ModernClient:
    return proxy.modern(who, capabilities=capabilities)


def schema_problems(definition: str, value: JSONDict) -> list[str]:
    return errors("ext-tasks", definition, value)


async def created(client: ModernClient, params: JSONDict = RESEARCH) -> JSONDict:
    reply = await client.request("tools/call", params)
    assert reply.status == 200, reply.messages
    handle = reply.result
    assert handle["resultType"] == "task", handle
    assert schema_problems("CreateTaskResult", handle) == []
    return handle


async def get(client: ModernClient, task_id: str) -> McpReply:
    return await client.request("tasks/get", {"taskId": task_id})


async def until(client: ModernClient, task_id: str, done: Callable[[JSONDict], bool]) -> JSONDict:
    """Poll tasks/get (bounded by the caller's timeout) until `done(task)`."""
    while True:
        reply = await get(client, task_id)
        task = reply.result
        assert schema_problems("GetTaskResult", task) == []
        if done(task):
            return task
        await asyncio.sleep(0.02)


async def listened(client: ModernClient, task_ids: list[str], change: asyncio.Event) -> tuple[Any, Any]:
    """A listen (id "l-1") for `task_ids`: its acknowledgement, then, once `change` is set, the next
    notification."""
    message, response = await client.send("subscriptions/listen", {"notifications": {"taskIds": task_ids}}, id="l-1")
    stream = client.stream(response, message)
    try:
        ack = await stream.next()
        change.set()
        return ack, await stream.next()
    finally:
        stream.close()


def ended(task: JSONDict) -> bool:
    return task["status"] in ("completed", "failed", "cancelled")


async def test_discover_declares_the_extension_for_a_server_that_runs_calls_as_tasks(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request("server/discover")
    assert reply.result["capabilities"]["extensions"] == {EXTENSION: {}}
    assert "tasks" not in reply.result["capabilities"]  # the 2025-11-25 slot is not the extension's


async def test_discover_does_not_declare_it_without_tasks_upstream_or_with_tasks_off(
    make_proxy: Any, fake: FakeLegacy
) -> None:
    plain = await make_proxy()
    async with asyncio.timeout(WAIT):
        reply = await declaring(plain).request("server/discover")
    assert "extensions" not in reply.result["capabilities"]
    task_server(fake, None)
    off = await make_proxy(**{"tasks.enabled": False})
    async with asyncio.timeout(WAIT):
        reply = await declaring(off).request("server/discover")
    assert "extensions" not in reply.result["capabilities"]


async def test_a_declaring_clients_call_becomes_a_task_whose_result_tasks_get_inlines(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    release = asyncio.Event()
    task_server(fake, answered_after(release, {**tool_result("tides are lunar"), "_meta": dict(RELATED)}))
    client = declaring(proxy, capabilities=TASKS)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        working = (await get(client, handle["taskId"])).result
        release.set()
        done = await until(client, handle["taskId"], ended)
    assert handle["status"] == "working" and handle["ttlMs"] == 3_600_000 and handle["pollIntervalMs"] == 1000
    assert {"result", "error", "inputRequests", "ttl", "pollInterval"}.isdisjoint(handle)
    assert handle["taskId"] != TASK["taskId"]  # the proxy's own id: the upstream's is bound to its session
    assert working["resultType"] == "complete" and working["status"] == "working"
    assert done["status"] == "completed"
    assert done["result"]["content"] == tool_result("tides are lunar")["content"]
    assert meta.RELATED_TASK not in done["result"].get("_meta", {})  # an inlined result is not tagged
    [call] = fake.calls_of("tools/call")
    assert call.params["task"] == {}  # the server's own task backs the proxy's
    assert fake.calls_of("tasks/result")[0].params == {"taskId": TASK["taskId"]}


async def test_a_client_that_does_not_declare_the_extension_gets_the_result_itself(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    task_server(fake, respond_with(tool_result("tides are lunar")))
    async with asyncio.timeout(WAIT):
        reply = await proxy.modern("Bearer alice", capabilities={}).request("tools/call", RESEARCH)
    assert reply.result["resultType"] == "complete"
    assert reply.result["content"] == tool_result("tides are lunar")["content"]


async def test_a_tool_that_does_not_run_as_a_task_is_answered_at_once(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request("tools/call", {"name": "echo", "arguments": {}})
    assert reply.result["resultType"] == "complete"
    assert "task" not in fake.calls_of("tools/call")[0].params


async def test_a_2025_task_param_from_a_modern_client_is_not_taken_for_one(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    params = {"name": "echo", "arguments": {}, "task": {"ttl": 1000}}
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request("tools/call", params)
    assert reply.result["resultType"] == "complete"  # 2026-07-28 servers ignore `task`
    assert "task" not in fake.calls_of("tools/call")[0].params


async def test_input_the_task_needs_is_in_tasks_get_and_tasks_update_answers_it(proxy: Proxy, fake: FakeLegacy) -> None:
    async def result(call: Call) -> Outcome:
        answer = await call.ask("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)})
        return tool_result(f"researched: {answer['result']['content']['confirm']}")

    task_server(fake, result)
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        asking = await until(client, handle["taskId"], lambda t: t["status"] != "working")
        [key] = asking["inputRequests"]
        acked = await client.request("tasks/update", {"taskId": handle["taskId"], "inputResponses": {key: ACCEPTED}})
        done = await until(client, handle["taskId"], ended)
    assert asking["status"] == "input_required"
    assert asking["inputRequests"][key]["method"] == "elicitation/create"
    assert asking["inputRequests"][key]["params"]["message"] == ELICIT_PARAMS["message"]
    assert acked.result == {"resultType": "complete"}
    assert done["status"] == "completed" and done["result"]["content"] == tool_result("researched: True")["content"]
    assert len(fake.calls_of("tools/call")) == 1  # answered in the same upstream call, not a new one


async def test_on_the_get_stream_only_a_request_tagged_with_the_task_is_the_tasks(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    # server-everything lists the roots of each new session on its GET stream while the task runs;
    # a client that cannot give roots must not see its task fail for it.
    async def result(call: Call) -> Outcome:
        assert call.session is not None
        await call.session.stream()
        untagged = await call.session.request("roots/list").answer()
        tagged = await call.session.request("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)}).answer()
        return tool_result(f"roots: {untagged['error']['code']}, confirm: {tagged['result']['content']['confirm']}")

    task_server(fake, result)
    client = declaring(proxy, capabilities={"elicitation": {}, **TASKS})  # no roots
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        asking = await until(client, handle["taskId"], lambda t: t["status"] != "working")
        [key] = asking["inputRequests"]
        await client.request("tasks/update", {"taskId": handle["taskId"], "inputResponses": {key: ACCEPTED}})
        done = await until(client, handle["taskId"], ended)
    assert asking["inputRequests"][key]["method"] == "elicitation/create"
    assert done["status"] == "completed", done
    assert done["result"]["content"] == tool_result(f"roots: {jsonrpc.INTERNAL_ERROR}, confirm: True")["content"]


async def test_answers_to_keys_not_asked_are_ignored_and_the_task_waits_for_its_own(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    async def result(call: Call) -> Outcome:
        answer = await call.ask("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)})
        return tool_result(f"researched: {answer['result']['action']}")

    task_server(fake, result)
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        asking = await until(client, handle["taskId"], lambda t: t["status"] != "working")
        stray = await client.request("tasks/update", {"taskId": handle["taskId"], "inputResponses": {"nope": ACCEPTED}})
        still = (await get(client, handle["taskId"])).result
    assert stray.result == {"resultType": "complete"}
    assert still["status"] == "input_required" and still["inputRequests"] == asking["inputRequests"]


async def test_a_cancelled_task_is_cancelled_upstream_and_cancelling_again_is_acknowledged(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    task_server(fake, answered_after(asyncio.Event(), None))  # never ends by itself
    fake.handlers["tasks/cancel"] = lambda call: asyncio.sleep(0, {**TASK, "status": "cancelled"})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        await fake.next_call("tasks/result")
        first = await client.request("tasks/cancel", {"taskId": handle["taskId"]})
        upstream = await fake.next_call("tasks/cancel")
        task = (await get(client, handle["taskId"])).result
        again = await client.request("tasks/cancel", {"taskId": handle["taskId"]})
    assert first.result == again.result == {"resultType": "complete"}
    assert schema_problems("CancelTaskResult", first.result) == []
    assert task["status"] == "cancelled" and "result" not in task
    assert upstream.params == {"taskId": TASK["taskId"]}


async def test_a_task_cancelled_while_the_server_still_creates_its_own_is_cancelled_upstream(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    # The handle comes at once, before the server answered the call with its task: a cancel then
    # is for the task that answer names (notifications/cancelled does not cancel a task).
    release = asyncio.Event()

    async def never(call: Call) -> Outcome:
        await asyncio.Event().wait()
        return None

    async def creating(call: Call) -> Outcome:
        await release.wait()
        return {"task": TASK}

    task_server(fake, never)
    fake.handlers["tools/call"] = creating
    fake.handlers["tasks/cancel"] = lambda call: asyncio.sleep(0, {**TASK, "status": "cancelled"})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        await fake.next_call("tools/call")
        acked = await client.request("tasks/cancel", {"taskId": handle["taskId"]})
        release.set()
        upstream = await fake.next_call("tasks/cancel")
        task = (await get(client, handle["taskId"])).result
    assert acked.result == {"resultType": "complete"}
    assert upstream.params == {"taskId": TASK["taskId"]}
    assert task["status"] == "cancelled"
    assert fake.calls_of("notifications/cancelled") == []


async def test_an_error_ends_the_task_failed_with_it_and_a_tool_error_ends_it_completed(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    outcomes = [error(-32603, "API rate limit exceeded"), {**tool_result("no such topic"), "isError": True}]

    async def result(call: Call) -> Outcome:
        return outcomes.pop(0)

    task_server(fake, result)
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        failed = await until(client, (await created(client))["taskId"], ended)
        tool_error = await until(client, (await created(client))["taskId"], ended)
    assert failed["status"] == "failed" and failed["error"]["code"] == -32603
    assert failed["error"]["message"] == "API rate limit exceeded" and "result" not in failed
    assert tool_error["status"] == "completed" and tool_error["result"]["isError"] is True  # not "failed"


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_unknown_and_foreign_task_ids_are_not_found(proxy: Proxy, fake: FakeLegacy, method: str) -> None:
    task_server(fake, respond_with(tool_result("done")))
    alice, bob = declaring(proxy), declaring(proxy, "Bearer bob")
    params: JSONDict = {"inputResponses": {}} if method == "tasks/update" else {}
    async with asyncio.timeout(WAIT):
        handle = await created(alice)
        unknown = await bob.request(method, {"taskId": "no-such-task", **params})
        foreign = await bob.request(method, {"taskId": handle["taskId"], **params})
        own = await until(alice, handle["taskId"], ended)
    for reply in (unknown, foreign):
        assert reply.error["code"] == jsonrpc.INVALID_PARAMS
        assert reply.error["message"] == "Failed to retrieve task: Task not found"
    assert own["status"] == "completed"  # bob's cancel did not touch alice's task


@pytest.mark.parametrize("method", ["tasks/get", "tasks/update", "tasks/cancel"])
async def test_tasks_methods_without_the_extension_are_missing_capability_400(
    proxy: Proxy, fake: FakeLegacy, method: str
) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await proxy.modern("Bearer alice", capabilities={}).request(method, {"taskId": "t"})
    assert reply.status == 400
    assert reply.error["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY
    assert reply.error["data"] == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


@pytest.mark.parametrize("method", ["tasks/result", "tasks/list"])
async def test_the_methods_the_extension_removed_are_not_found_404(proxy: Proxy, fake: FakeLegacy, method: str) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request(method, {"taskId": "t"} if method == "tasks/result" else {})
    assert reply.status == 404 and reply.error["code"] == jsonrpc.METHOD_NOT_FOUND


async def test_tasks_get_with_another_task_in_mcp_name_is_a_header_mismatch(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request("tasks/get", {"taskId": "t-1"}, headers={"Mcp-Name": "t-2"})
        missing = await declaring(proxy).request("tasks/get", {"taskId": "t-1"}, headers={"Mcp-Name": None})
    assert reply.status == missing.status == 400
    assert reply.error["code"] == missing.error["code"] == jsonrpc.HEADER_MISMATCH


async def test_bad_input_responses_are_invalid_params(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    async with asyncio.timeout(WAIT):
        reply = await declaring(proxy).request("tasks/update", {"taskId": "t", "inputResponses": ["yes"]})
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS


async def test_a_task_is_gone_once_its_retention_passed(make_proxy: Any, fake: FakeLegacy) -> None:
    task_server(fake, respond_with(tool_result("done")))
    proxy = await make_proxy(**{"tasks.default_ttl_s": 0.3})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        reply = await get(client, handle["taskId"])
        while reply.final is not None and "result" in reply.final:  # polled until it is gone
            await asyncio.sleep(0.05)
            reply = await get(client, handle["taskId"])
    assert handle["ttlMs"] == 300
    assert reply.error["code"] == jsonrpc.INVALID_PARAMS


async def test_a_listen_stream_for_the_task_gets_its_changes_as_notifications_tasks(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    release = asyncio.Event()
    task_server(fake, answered_after(release, tool_result("tides are lunar")))
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        ack, note = await listened(client, [handle["taskId"], "not-mine"], release)
    assert ack is not None and ack["params"]["notifications"]["taskIds"] == [handle["taskId"]]
    assert note is not None and note["method"] == "notifications/tasks"
    assert schema_problems("TaskStatusNotification", note) == []
    assert note["params"]["taskId"] == handle["taskId"] and note["params"]["status"] == "completed"
    assert note["params"]["result"]["content"] == tool_result("tides are lunar")["content"]
    assert note["params"]["_meta"] == {meta.SUBSCRIPTION_ID: "l-1"}


async def test_a_listen_for_task_ids_without_the_extension_is_still_refused(proxy: Proxy, fake: FakeLegacy) -> None:
    task_server(fake, None)
    client = proxy.modern("Bearer alice", capabilities={})
    async with asyncio.timeout(WAIT):
        reply = await client.request("subscriptions/listen", {"notifications": {"taskIds": ["t"]}}, id="l-1")
    assert reply.status == 400 and reply.error["code"] == jsonrpc.MISSING_REQUIRED_CAPABILITY


async def test_a_task_cancelled_while_it_waits_for_input_is_cancelled_upstream(proxy: Proxy, fake: FakeLegacy) -> None:
    answered: asyncio.Future[JSONDict] = asyncio.get_running_loop().create_future()

    async def result(call: Call) -> Outcome:
        answered.set_result(await call.ask("elicitation/create", {**ELICIT_PARAMS, "_meta": dict(RELATED)}))
        await asyncio.Event().wait()
        return None

    task_server(fake, result)
    fake.handlers["tasks/cancel"] = lambda call: asyncio.sleep(0, {**TASK, "status": "cancelled"})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        await until(client, handle["taskId"], lambda t: t["status"] == "input_required")
        await client.request("tasks/cancel", {"taskId": handle["taskId"]})
        upstream = await fake.next_call("tasks/cancel")
        answer = await answered
        task = (await get(client, handle["taskId"])).result
    assert upstream.params == {"taskId": TASK["taskId"]}
    assert answer["result"]["action"] == "cancel"  # the server's question is not left hanging
    assert task["status"] == "cancelled" and "inputRequests" not in task


async def test_a_partial_answer_leaves_the_other_request_outstanding_until_it_is_answered(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    async def result(call: Call) -> Outcome:
        tagged = {**ELICIT_PARAMS, "_meta": dict(RELATED)}
        first, second = await asyncio.gather(call.ask("elicitation/create", tagged), call.ask("roots/list", {}))
        return tool_result(f"{first['result']['action']} with {len(second['result']['roots'])} roots")

    task_server(fake, result)
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        asking = await until(client, handle["taskId"], lambda t: len(t.get("inputRequests", {})) == 2)
        keys = {request["method"]: key for key, request in asking["inputRequests"].items()}
        elicit = {"taskId": handle["taskId"], "inputResponses": {keys["elicitation/create"]: ACCEPTED}}
        await client.request("tasks/update", elicit)
        partly = (await get(client, handle["taskId"])).result
        roots = {"taskId": handle["taskId"], "inputResponses": {keys["roots/list"]: {"roots": []}}}
        await client.request("tasks/update", roots)
        done = await until(client, handle["taskId"], ended)
    assert partly["status"] == "input_required" and list(partly["inputRequests"]) == [keys["roots/list"]]
    assert done["status"] == "completed" and done["result"]["content"] == tool_result("accept with 0 roots")["content"]


async def test_a_hosted_call_may_take_as_long_as_its_task_is_kept_not_one_requests_bound(
    make_proxy: Any, fake: FakeLegacy
) -> None:
    async def result(call: Call) -> Outcome:
        await asyncio.sleep(0.6)  # the upstream's work: longer than upstream.request_timeout_s
        return tool_result("slow but done")

    task_server(fake, result)
    proxy = await make_proxy(**{"upstream.request_timeout_s": 0.2})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        done = await until(client, (await created(client))["taskId"], ended)
        plain = await proxy.modern("Bearer alice", capabilities={}).request("tools/call", RESEARCH)
    assert done["status"] == "completed" and done["result"]["content"] == tool_result("slow but done")["content"]
    assert plain.error["code"] == jsonrpc.UPSTREAM_TIMEOUT  # the same call, not hosted, has the request's bound


async def test_past_the_tasks_kept_per_caller_a_call_is_refused_and_other_callers_are_not(
    make_proxy: Any, fake: FakeLegacy
) -> None:
    task_server(fake, respond_with(tool_result("done")))
    proxy = await make_proxy(**{"tasks.max_per_caller": 1})
    async with asyncio.timeout(WAIT):
        kept = await created(declaring(proxy))
        refused = await declaring(proxy).request("tools/call", RESEARCH)
        other = await created(declaring(proxy, "Bearer bob"))
    assert refused.error["code"] == jsonrpc.LIMIT_EXCEEDED
    assert "tasks.max_per_caller" in refused.error["message"]
    assert kept["taskId"] != other["taskId"]


async def test_a_running_task_shows_the_status_message_of_the_servers_task_behind_it(
    proxy: Proxy, fake: FakeLegacy
) -> None:
    release = asyncio.Event()
    task_server(fake, answered_after(release, tool_result("done")))
    fake.handlers["tasks/get"] = lambda call: asyncio.sleep(0, {**TASK, "statusMessage": "Gathering sources..."})
    client = declaring(proxy)
    async with asyncio.timeout(WAIT):
        handle = await created(client)
        await fake.next_call("tasks/result")  # the server's task exists
        working = (await get(client, handle["taskId"])).result
        asked = await fake.next_call("tasks/get")
        release.set()
        done = await until(client, handle["taskId"], ended)
    assert working["status"] == "working" and working["statusMessage"] == "Gathering sources..."
    assert asked.params == {"taskId": TASK["taskId"]}
    assert "statusMessage" not in done  # once it ended, the record alone answers
