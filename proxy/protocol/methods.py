"""Method tables the spec fixes for both eras (one source for every module that needs them), and
which resources a `notifications/resources/updated` concerns."""

from __future__ import annotations

# Results a server marks with ttlMs / cacheScope (2026-07-28/server/utilities/caching.mdx).
CACHEABLE_METHODS = frozenset(
    {
        "server/discover",
        "tools/list",
        "prompts/list",
        "resources/list",
        "resources/templates/list",
        "resources/read",
    }
)
# Extension results that carry ttlMs / cacheScope in 2026-07-28 as the core cacheable ones do: the
# Skills extension's (SEP-2640; io.modelcontextprotocol/skills). Translating a legacy server's answer,
# the proxy gives them the same configured hint; its own response cache keeps only CACHEABLE_METHODS.
HINTED_METHODS = CACHEABLE_METHODS | frozenset({"skills/list", "skills/get", "resources/directory/read"})
# The client notifications of either era the proxy acts on or drops itself (docs/translation.md
# §3.3, §4.1 row 4): any other, an extension's, is sent on to the server (§2.1).
CORE_CLIENT_NOTIFICATIONS = frozenset(
    {
        "notifications/initialized",
        "notifications/cancelled",
        "notifications/roots/list_changed",
        "notifications/progress",
        "notifications/tasks/status",
    }
)
# Requests on which a modern server may answer input_required (mrtr.mdx §Supported Requests).
INPUT_REQUIRED_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
# What may be asked of the client: legacy server requests / modern inputRequests entries.
INPUT_REQUEST_METHODS = frozenset({"elicitation/create", "sampling/createMessage", "roots/list"})
# subscriptions/listen filter key -> (the server capability with `listChanged`, its notification).
LIST_CHANGED = {
    "toolsListChanged": ("tools", "notifications/tools/list_changed"),
    "promptsListChanged": ("prompts", "notifications/prompts/list_changed"),
    "resourcesListChanged": ("resources", "notifications/resources/list_changed"),
}


def uri_within(uri: str, updated: str) -> bool:
    """Whether an update of `updated` concerns `uri`: the resource itself or one below it."""
    return uri == updated or uri.startswith(updated.rstrip("/") + "/")
