#!/usr/bin/env node
// An MCP Apps host, or a plain client, on the TypeScript SDK from the npm test peers: v1
// (@modelcontextprotocol/sdk, a legacy host) or v2 (@modelcontextprotocol/client pinned to
// 2026-07-28, a modern host), over Streamable HTTP, or over stdio to a command it starts
// ("command", "args": `mcp-era-proxy stdio ...` as a desktop host starts it). It declares the extensions it is given
// (`capabilities.extensions`), then lists the tools, reads the `ui://` resource of every tool that
// names one in `_meta.ui.resourceUri`, calls the tools it is told to, and prints ONE JSON object of
// what it saw on the last line of stdout: the server's declared capabilities, the tools, the
// resources read, the call results. It does not judge pass/fail.
//
//   node apps_host.cjs '{"sdk": "v1"|"v2", "url": ..., "extensions": {...}, "call": ["tool", ...]}'
//   node apps_host.cjs '{"sdk": ..., "command": ..., "args": [...], "cwd": ..., ...}'
//
// Modules are resolved from $MCP_PEERS_HOME (default ~/.cache/mcp-test-peers).
const path = require("path");
const os = require("os");
const { createRequire } = require("module");

const home = process.env.MCP_PEERS_HOME || path.join(os.homedir(), ".cache", "mcp-test-peers");
const peerRequire = createRequire(path.join(home, "package.json"));

function sdk(version) {
  if (version === "v2") {
    const client = peerRequire("@modelcontextprotocol/client");
    return {
      Client: client.Client,
      Transport: client.StreamableHTTPClientTransport,
      StdioTransport: peerRequire("@modelcontextprotocol/client/stdio").StdioClientTransport,
      options: { versionNegotiation: { mode: { pin: "2026-07-28" } } },
    };
  }
  return {
    Client: peerRequire("@modelcontextprotocol/sdk/client/index.js").Client,
    Transport: peerRequire("@modelcontextprotocol/sdk/client/streamableHttp.js").StreamableHTTPClientTransport,
    StdioTransport: peerRequire("@modelcontextprotocol/sdk/client/stdio.js").StdioClientTransport,
    options: {},
  };
}

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const version = spec.sdk || "v1";
  const { Client, Transport, StdioTransport, options } = sdk(version);
  const capabilities = spec.extensions ? { extensions: spec.extensions } : {};
  const client = new Client({ name: "apps-host", version: "1.0.0" }, { capabilities, ...options });
  const transport = spec.command
    ? new StdioTransport({ command: spec.command, args: spec.args || [], cwd: spec.cwd, stderr: "ignore" })
    : new Transport(new URL(spec.url));
  await client.connect(transport);
  const out = { serverCapabilities: client.getServerCapabilities(), resources: {}, calls: {} };
  out.tools = (await client.listTools()).tools;
  for (const tool of out.tools) {
    const uri = tool._meta && tool._meta.ui && tool._meta.ui.resourceUri;
    if (uri) out.resources[uri] = (await client.readResource({ uri })).contents;
  }
  for (const name of spec.call || []) {
    const params = { name, arguments: {} };
    // v1: callTool(params, resultSchema, options); v2: callTool(params, options).
    out.calls[name] = version === "v2" ? await client.callTool(params) : await client.callTool(params, undefined);
  }
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
