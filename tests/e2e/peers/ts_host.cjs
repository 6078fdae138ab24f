#!/usr/bin/env node
// A host built on the TypeScript SDK, from the npm test peers: v1 (@modelcontextprotocol/sdk,
// a legacy host) or, with "sdk": "v2" in the spec, v2 (@modelcontextprotocol/client pinned to
// 2026-07-28, a modern host). It starts a server process with StdioClientTransport (or, with
// "sse_url" in the spec, v1 only, connects with SSEClientTransport: the 2024-11-05 HTTP+SSE
// transport), initializes, lists the tools, calls one (with progress), answers elicitation
// requests, and prints ONE JSON object of what it saw on the last line of stdout. It does not
// judge pass/fail.
//
//   node ts_host.cjs '{"command": ..., "args": [...], "tool": ..., "arguments": {...}}'
//   node ts_host.cjs '{"sse_url": "http://127.0.0.1:PORT/sse", "tool": ..., "arguments": {...}}'
//
// The SDKs come from the npm test peers (ts_sdk.cjs).
const { peerRequire, sdk, run } = require("./ts_sdk.cjs");

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const { Client, StdioClientTransport, elicit, roots, options } = sdk(spec.sdk || "v1");
  const out = { progress: [], elicitations: [] };
  const transport = spec.sse_url
    ? new (peerRequire("@modelcontextprotocol/sdk/client/sse.js").SSEClientTransport)(new URL(spec.sse_url))
    : new StdioClientTransport({
        command: spec.command,
        args: spec.args || [],
        env: spec.env,
        cwd: spec.cwd,
        stderr: "ignore",
      });
  const client = new Client(
    { name: "ts-stdio-host", version: "1.0.0" },
    { capabilities: { elicitation: { form: {} }, roots: {} }, ...options },
  );
  client.setRequestHandler(elicit, async (request) => {
    out.elicitations.push(request.params.message);
    return { action: "accept", content: spec.elicit_content || { name: "Ada" } };
  });
  client.setRequestHandler(roots, async () => ({ roots: [{ uri: "file:///tmp/root-a" }] }));
  await client.connect(transport);
  out.serverInfo = client.getServerVersion();
  out.tools = (await client.listTools()).tools.map((t) => t.name);
  const params = { name: spec.tool, arguments: spec.arguments || {} };
  const requestOptions = { onprogress: (p) => out.progress.push(p.progress), timeout: 30000 };
  // v1: callTool(params, resultSchema, options); v2: callTool(params, options).
  const result =
    spec.sdk === "v2"
      ? await client.callTool(params, requestOptions)
      : await client.callTool(params, undefined, requestOptions);
  out.result = result;
  await client.close();
  return out;
}

run(main);
