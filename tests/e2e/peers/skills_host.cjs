#!/usr/bin/env node
// A Skills host (SEP-2640) on the TypeScript SDK v2 from the npm test peers
// (@modelcontextprotocol/client 2.4.0 and its `ext/skills` SkillsClient), speaking either era: "legacy"
// (the client's default, `initialize`) or "modern" (pinned to 2026-07-28), over Streamable HTTP or
// over stdio to a command it starts. It lists the server's skills, gets each by its URI, reads and
// verifies every file of every skill (size, digest, SKILL.md frontmatter), reads each skill's
// directory when the server serves directories, and prints ONE JSON object of what it saw on the
// last line of stdout. It does not judge pass/fail.
//
//   node skills_host.cjs '{"era": "legacy"|"modern", "url": ...}'
//   node skills_host.cjs '{"era": ..., "command": ..., "args": [...], "cwd": ...}'
const { peerRequire, run } = require("./ts_sdk.cjs");

async function main() {
  const spec = JSON.parse(process.argv[2]);
  const { Client, StreamableHTTPClientTransport } = peerRequire("@modelcontextprotocol/client");
  const { StdioClientTransport } = peerRequire("@modelcontextprotocol/client/stdio");
  const { SkillsClient } = peerRequire("@modelcontextprotocol/client/ext/skills");
  const options = spec.era === "modern" ? { versionNegotiation: { mode: { pin: "2026-07-28" } } } : {};
  const client = new Client({ name: "skills-host", version: "1.0.0" }, { capabilities: {}, ...options });
  const transport = spec.command
    ? new StdioClientTransport({ command: spec.command, args: spec.args || [], cwd: spec.cwd, stderr: "ignore" })
    : new StreamableHTTPClientTransport(new URL(spec.url));
  await client.connect(transport);
  const skills = new SkillsClient(client);
  const out = { supported: skills.supported, directoryRead: skills.directoryRead, files: {}, directories: {}, got: {} };
  const listing = await skills.list();
  out.listing = { skills: listing.skills, invalid: listing.invalid, ttlMs: listing.ttlMs, cacheScope: listing.cacheScope };
  for (const skill of listing.skills) {
    const got = await skills.get(skill.uri);
    out.got[skill.uri] = got.skill;
    for (const resource of skill.resources) {
      const file = await skills.read(skill, resource.uri);
      out.files[resource.uri] = { mimeType: file.mimeType, text: file.text, verified: file.verified };
    }
    if (skills.directoryRead) {
      const root = skill.uri.slice(0, skill.uri.lastIndexOf("/"));
      out.directories[root] = (await skills.readDirectory(root)).resources;
    }
  }
  await client.close();
  return out;
}

run(main);
