// The TypeScript SDKs of the npm test peers, for the Node hosts in this folder: v1
// (@modelcontextprotocol/sdk, a legacy client) and v2 (@modelcontextprotocol/client, pinned to
// 2026-07-28, a modern client), each with its transports; and how a host ends its run (one JSON
// line of observations on stdout). Modules are resolved from $MCP_PEERS_HOME (default
// ~/.cache/mcp-test-peers).
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
      StdioClientTransport: peerRequire("@modelcontextprotocol/client/stdio").StdioClientTransport,
      StreamableHTTPClientTransport: client.StreamableHTTPClientTransport,
      elicit: "elicitation/create",
      roots: "roots/list",
      options: { versionNegotiation: { mode: { pin: "2026-07-28" } } },
    };
  }
  return {
    Client: peerRequire("@modelcontextprotocol/sdk/client/index.js").Client,
    StdioClientTransport: peerRequire("@modelcontextprotocol/sdk/client/stdio.js").StdioClientTransport,
    StreamableHTTPClientTransport: peerRequire("@modelcontextprotocol/sdk/client/streamableHttp.js")
      .StreamableHTTPClientTransport,
    elicit: peerRequire("@modelcontextprotocol/sdk/types.js").ElicitRequestSchema,
    roots: peerRequire("@modelcontextprotocol/sdk/types.js").ListRootsRequestSchema,
    options: {},
  };
}

// Runs the host's main(); what it resolves is printed as ONE JSON line, a failure as {"error"}.
function run(main) {
  main().then(
    (out) => {
      process.stdout.write(JSON.stringify(out) + "\n");
      process.exit(0);
    },
    (err) => {
      process.stdout.write(JSON.stringify({ error: String(err && err.stack ? err.stack : err) }) + "\n");
      process.exit(1);
    },
  );
}

module.exports = { peerRequire, sdk, run };
