#!/usr/bin/env node
// A host for the conformance runner's client scenarios (`conformance client --command ...`), on the
// TypeScript SDK from the npm test peers: v1 (@modelcontextprotocol/sdk, a legacy host: through the
// proxy it becomes the 2026-07-28 client the runner judges) or v2 (@modelcontextprotocol/client
// pinned to 2026-07-28, a native modern client, the reference).
//
//   MCP_CONFORMANCE_SCENARIO=... [MCP_CONFORMANCE_CONTEXT=...] node conformance_client.cjs v1|v2 URL
//
// It behaves as an ordinary host does, the same for both SDKs: it declares roots, sampling and
// elicitation, accepts an elicitation with {confirmed: true}, lists the server's tools and calls what
// the scenario is about (the calls the runner lists in its context, else every tool it was offered,
// else the one each scenario names). It never builds a wire message itself: whatever reaches the
// runner's server is what the SDK, and the proxy when there is one, made of it. It prints ONE JSON
// line of what it saw and exits 1 when a step failed.
const { sdk, run } = require("./ts_sdk.cjs");

const MRTR = ["test_mrtr_echo_state", "test_mrtr_no_state", "test_mrtr_no_result_type"];

async function main() {
  const version = process.argv[2];
  const url = process.argv[process.argv.length - 1];
  const scenario = process.env.MCP_CONFORMANCE_SCENARIO;
  const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT || "{}");
  const { Client, StreamableHTTPClientTransport, elicit, options } = sdk(version);
  const capabilities = { roots: {}, sampling: {}, elicitation: {} };
  const client = new Client({ name: "conformance-host", version: "1.0.0" }, { capabilities, ...options });
  const call = (name, args) =>
    version === "v2" ? client.callTool({ name, arguments: args }) : client.callTool({ name, arguments: args }, undefined);

  // MRTR isolation (sep-2322): while the server waits for the first answer, the host calls an
  // unrelated tool; that call must not carry the other call's input responses or state.
  let unrelatedFirst = scenario === "sep-2322-client-request-state";
  const elicited = [];
  client.setRequestHandler(elicit, async (request) => {
    elicited.push(request.params && request.params.message);
    if (unrelatedFirst) {
      unrelatedFirst = false;
      await call("test_mrtr_unrelated", {});
    }
    return { action: "accept", content: { confirmed: true } };
  });

  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  const out = { scenario, calls: {}, elicited };
  const tools = (await client.listTools()).tools;
  out.tools = tools.map((t) => t.name);
  if (Array.isArray(context.toolCalls)) {
    for (const { name, arguments: args } of context.toolCalls) out.calls[name] = await call(name, args || {});
  } else if (scenario === "tools_call") {
    if (tools[0]) out.calls[tools[0].name] = await call(tools[0].name, { a: 2, b: 3 });
  } else if (scenario === "json-schema-2020-12-preservation") {
    const focal = tools.find((t) => t.name === "json_schema_2020_12_tool");
    if (!focal) throw new Error("json_schema_2020_12_tool not offered");
    out.calls.json_schema_echo = await call("json_schema_echo", { schema: focal.inputSchema });
  } else if (scenario === "sep-2322-client-request-state") {
    for (const name of MRTR) out.calls[name] = await call(name, {});
  } else if (scenario === "http-standard-headers" || scenario === "http-invalid-tool-headers") {
    // Every tool it was offered; a host never sees the ones a client must leave out.
    for (const tool of tools) out.calls[tool.name] = await call(tool.name, {});
    if (scenario === "http-standard-headers") {
      const [resource] = (await client.listResources()).resources;
      if (resource) out.read = await client.readResource({ uri: resource.uri });
      const [prompt] = (await client.listPrompts()).prompts;
      if (prompt) out.prompt = await client.getPrompt({ name: prompt.name, arguments: {} });
    }
  }
  // request-metadata, json-schema-ref-no-deref: the listing is the whole scenario.
  await client.close();
  return out;
}

run(main);
