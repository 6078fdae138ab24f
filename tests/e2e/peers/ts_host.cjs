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
// Modules are resolved from $MCP_PEERS_HOME (default ~/.cache/mcp-test-peers).
const path = require("path");
const os = require("os");
const { createRequire } = require("module");

const home = process.env.MCP_PEERS_HOME || path.join(os.homedir(), ".cache", "mcp-test-peers");
const peerRequire = createRequire(path.join(home, "package.json"));

function sdk(version) {
  if (version === "v2") {
    return {
      Client: peerRequire("@modelcontextprotocol/client").Client,
      StdioClientTransport: peerRequire("@modelcontextprotocol/client/stdio").StdioClientTransport,
      elicit: "elicitation/create",
      roots: "roots/list",
      options: { versionNegotiation: { mode: { pin: "2026-07-28" } } },
    };
  }
  return {
    Client: peerRequire("@modelcontextprotocol/sdk/client/index.js").Client,
    StdioClientTransport: peerRequire("@modelcontextprotocol/sdk/client/stdio.js").StdioClientTransport,
    elicit: peerRequire("@modelcontextprotocol/sdk/types.js").ElicitRequestSchema,
    roots: peerRequire("@modelcontextprotocol/sdk/types.js").ListRootsRequestSchema,
    options: {},
  };
}

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
  process.stdout.write(JSON.stringify(out) + "\n");
}

main().then(
  () => process.exit(0),
  (err) => {
    process.stdout.write(JSON.stringify({ error: String(err && err.stack ? err.stack : err) }) + "\n");
    process.exit(1);
  },
);
