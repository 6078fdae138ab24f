#!/usr/bin/env node
// A 2025-11-25 task requestor built on the TypeScript SDK v1 (@modelcontextprotocol/sdk, from the
// npm test peers): it connects over Streamable HTTP, declares elicitation (its handler records
// each request, _meta included, and accepts with `elicit_content`), runs ONE scenario with the
// SDK's task API (client.experimental.tasks: callToolStream, getTask, getTaskResult, listTasks,
// cancelTask) and prints ONE JSON object of what it saw on the last line of stdout. It does not
// judge pass/fail.
//
//   node ts_task_client.cjs '{"url": "http://127.0.0.1:PORT/mcp", "scenario": "stream", ...}'
//
// Spec keys: url, scenario, tool, arguments, ttl (ms; absent: the SDK decides from tools/list),
// notify_wait_ms (scenario "stream": how long to wait for the final notifications/tasks/status),
// headers (sent on every HTTP request, e.g. Authorization), task_id (scenario "read"),
// check_tool (scenario "cancel"), deadline_ms (scenario "expiry"), count (scenario "list").
// Scenarios:
//   stream  listTools, then callToolStream: events (taskCreated / taskStatus / result / error),
//           then (bounded) the task's terminal notifications/tasks/status
//   cancel  callToolStream of a slow tool; once it reports progress (it runs upstream), cancelTask,
//           then cancelTask again; the stream's end, a concurrent getTaskResult, the check tool
//   unknown getTask / getTaskResult / cancelTask on an id nobody made
//   expiry  a task with ttl; poll getTask (bounded by deadline_ms) until it is refused
//   list    `count` tasks, then listTasks
//   create  one task, followed with getTask until it ended; then the session is ended (DELETE)
//   read    getTask and getTaskResult of `task_id` on a new session
// Errors are recorded as {code, message}. The SDK comes from the npm test peers (ts_sdk.cjs).
const { peerRequire, run } = require("./ts_sdk.cjs");

const { Client } = peerRequire("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = peerRequire("@modelcontextprotocol/sdk/client/streamableHttp.js");
const types = peerRequire("@modelcontextprotocol/sdk/types.js");

const TERMINAL = ["completed", "failed", "cancelled"];

function failure(err) {
  return { code: err && err.code !== undefined ? err.code : null, message: String(err && err.message ? err.message : err) };
}

async function attempt(fn) {
  try {
    return { ok: await fn() };
  } catch (err) {
    return { error: failure(err) };
  }
}

function event(message) {
  if (message.type === "taskCreated" || message.type === "taskStatus") {
    return { type: message.type, task: message.task };
  }
  if (message.type === "result") return { type: "result", result: message.result };
  return { type: "error", error: failure(message.error) };
}

async function until(predicate, deadlineMs, stepMs = 50) {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await predicate();
    if (value || Date.now() >= end) return value;
    await new Promise((resolve) => setTimeout(resolve, stepMs)); // polling cadence, bounded above
  }
}

function taskOptions(spec, extra) {
  return { timeout: 60000, ...(spec.ttl !== undefined ? { task: { ttl: spec.ttl } } : {}), ...extra };
}

const scenarios = {
  async stream(client, spec, out) {
    out.tools = (await client.listTools()).tools.map((t) => ({ name: t.name, execution: t.execution }));
    out.events = [];
    const params = { name: spec.tool, arguments: spec.arguments || {} };
    const options = taskOptions(spec, { onprogress: (p) => out.progress.push(p) });
    for await (const message of client.experimental.tasks.callToolStream(params, undefined, options)) {
      out.events.push(event(message));
    }
    // Status notifications come on the GET stream, unordered with the result: wait (bounded) for the last.
    const created = out.events.find((e) => e.task);
    if (created) {
      const ended = () => out.statusNotifications.some((n) => n.taskId === created.task.taskId && TERMINAL.includes(n.status));
      await until(ended, spec.notify_wait_ms || 3000);
    }
  },

  async cancel(client, spec, out) {
    const check = spec.check_tool || "cancelled_count";
    const count = async () => Number((await client.callTool({ name: check, arguments: {} })).content[0].text);
    out.checkBefore = await count();
    out.events = [];
    let taskId;
    let pendingResult;
    let progressed;
    const ran = new Promise((resolve) => (progressed = resolve));
    const params = { name: spec.tool || "slow", arguments: spec.arguments || { seconds: 10 } };
    const options = {
      timeout: 60000,
      task: { ttl: spec.ttl || 60000 },
      onprogress: (p) => {
        out.progress.push(p);
        progressed();
      },
    };
    for await (const message of client.experimental.tasks.callToolStream(params, undefined, options)) {
      out.events.push(event(message));
      if (message.type === "taskCreated") {
        taskId = message.task.taskId;
        // The proxy sends the call's progress on a tasks/result stream: open one, and wait for
        // progress, so the call is known to run upstream before it is cancelled.
        pendingResult = attempt(() => client.experimental.tasks.getTaskResult(taskId, types.CallToolResultSchema));
        await Promise.race([ran, pendingResult]);
        out.cancel = await attempt(() => client.experimental.tasks.cancelTask(taskId));
        out.cancelAgain = await attempt(() => client.experimental.tasks.cancelTask(taskId));
      }
    }
    out.taskId = taskId;
    out.pendingResult = await pendingResult;
    out.afterCancel = await attempt(() => client.experimental.tasks.getTask(taskId));
    const after = await until(async () => {
      const n = await count();
      return n > out.checkBefore ? n : null; // the server's count is the only signal there is
    }, 10000, 100);
    out.checkAfter = after === null ? out.checkBefore : after;
  },

  async unknown(client, spec, out) {
    const id = spec.task_id || "no-such-task";
    out.getTask = await attempt(() => client.experimental.tasks.getTask(id));
    out.getTaskResult = await attempt(() => client.experimental.tasks.getTaskResult(id, types.CallToolResultSchema));
    out.cancelTask = await attempt(() => client.experimental.tasks.cancelTask(id));
  },

  async expiry(client, spec, out) {
    out.events = [];
    const params = { name: spec.tool || "echo", arguments: spec.arguments || { text: "short-lived" } };
    const started = Date.now();
    for await (const message of client.experimental.tasks.callToolStream(params, undefined, taskOptions(spec))) {
      out.events.push(event(message));
    }
    const taskId = out.events[0].task.taskId;
    let last;
    out.expired = await until(
      async () => {
        last = await attempt(() => client.experimental.tasks.getTask(taskId));
        return last.error ? last : null;
      },
      spec.deadline_ms || 10000,
    );
    out.lastSeen = last;
    out.expiredAfterMs = Date.now() - started;
  },

  async list(client, spec, out) {
    out.created = [];
    for (let i = 0; i < (spec.count || 2); i += 1) {
      const created = await client.request(
        { method: "tools/call", params: { name: "echo", arguments: { text: `listed ${i}` }, task: { ttl: 60000 } } },
        types.CreateTaskResultSchema,
      );
      out.created.push(created.task.taskId);
    }
    out.listed = await client.experimental.tasks.listTasks();
  },

  async create(client, spec, out, transport) {
    const params = { name: spec.tool || "echo", arguments: spec.arguments || { text: "kept" }, task: { ttl: 60000 } };
    const created = await client.request({ method: "tools/call", params }, types.CreateTaskResultSchema);
    out.taskId = created.task.taskId;
    out.ended = await until(async () => {
      const task = await client.experimental.tasks.getTask(out.taskId);
      return TERMINAL.includes(task.status) ? task : null;
    }, 10000);
    out.sessionId = transport.sessionId;
    await transport.terminateSession(); // DELETE: the session ends, the task does not
  },

  async read(client, spec, out, transport) {
    out.sessionId = transport.sessionId;
    out.getTask = await attempt(() => client.experimental.tasks.getTask(spec.task_id));
    out.getTaskResult = await attempt(() =>
      client.experimental.tasks.getTaskResult(spec.task_id, types.CallToolResultSchema),
    );
  },
};

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const out = { scenario: spec.scenario, progress: [], elicitations: [], statusNotifications: [] };
  const transport = new StreamableHTTPClientTransport(new URL(spec.url), {
    requestInit: { headers: spec.headers || {} },
  });
  const client = new Client(
    { name: "ts-task-client", version: "1.0.0" },
    { capabilities: { elicitation: { form: {} } } },
  );
  client.setRequestHandler(types.ElicitRequestSchema, async (request) => {
    out.elicitations.push(request.params);
    return { action: "accept", content: spec.elicit_content || { name: "Ada" } };
  });
  client.setNotificationHandler(types.TaskStatusNotificationSchema, (notification) => {
    out.statusNotifications.push(notification.params);
  });
  await client.connect(transport);
  out.protocolVersion = transport.protocolVersion;
  out.serverCapabilities = client.getServerCapabilities();
  await scenarios[spec.scenario](client, spec, out, transport);
  await client.close();
  return out;
}

run(main);
