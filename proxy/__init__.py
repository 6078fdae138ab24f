"""mcp-era-proxy: a reverse proxy that lets MCP clients and servers of either protocol era talk.

Words used the same way in code, tests, metric labels and logs:

- downstream: the client side (the MCP client that called the proxy); upstream: the server side.
- legacy: revisions 2024-11-05 .. 2025-11-25 (initialize, sessions); modern: 2026-07-28 (stateless).
- relays are named by direction, client era first: legacy_to_modern serves legacy clients of a
  modern upstream, modern_to_legacy modern clients of a legacy upstream; same era is passed through.

Layers (imports point inward, tests/test_architecture.py holds the ranks): protocol/ is the pure
core (translation rules and the per-call state machines, no I/O); state/ keeps what outlives a
request (sessions, task records, the stores, sealing, the cache) and tracing/ the tracing interface;
upstream/ is the server-side edge, auth/ the caller's identity and tokens, cluster/ the replicas'
forwarding; relay/ executes the core's decisions between the edges; downstream/ is the client-side
edge; app.py composes them all. At the root only the composition (app, cli) and the cross-cutting
pieces (config, errors, logs, metrics). docs/design.md says how the pieces fit, docs/translation.md
what each rule is and why.
"""

__version__ = "0.1.0"

# How the proxy names itself to peers (serverInfo, clientInfo).
PROXY_INFO = {"name": "mcp-era-proxy", "version": __version__}
