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
//   node apps_host.cjs '{"sdk": "v1"|"v2", "url": ..., "extensions": {...}, "call": ["tool", ...],
//                        "notify": [{"method": ..., "params": {...}}, ...]}'
// (the notifications are sent right after connecting, before anything else)
//   node apps_host.cjs '{"sdk": ..., "command": ..., "args": [...], "cwd": ..., ...}'
//
// The SDKs come from the npm test peers (ts_sdk.cjs).
const { sdk, run } = require("./ts_sdk.cjs");

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const version = spec.sdk || "v1";
  const { Client, StreamableHTTPClientTransport, StdioClientTransport, options } = sdk(version);
  const capabilities = spec.extensions ? { extensions: spec.extensions } : {};
  const client = new Client({ name: "apps-host", version: "1.0.0" }, { capabilities, ...options });
  const transport = spec.command
    ? new StdioClientTransport({ command: spec.command, args: spec.args || [], cwd: spec.cwd, stderr: "ignore" })
    : new StreamableHTTPClientTransport(new URL(spec.url));
  await client.connect(transport);
  for (const note of spec.notify || []) await client.notification(note);
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
  return out;
}

run(main);
