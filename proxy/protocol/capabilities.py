"""Capability mapping between eras (docs/translation.md tables A, B and C), and the one rule for
what an input request needs from the client."""

from __future__ import annotations

from typing import Any

from . import jsonrpc
from .task_extension import EXTENSION as TASKS_EXTENSION
from .versions import legacy_at_least

JSONDict = dict[str, Any]

# Extensions the proxy translates itself rather than carries: tasks (2025-11-25's core `tasks`
# capability on one side, the 2026-07-28 extension on the other; docs/translation.md §3.10, §4.9).
TRANSLATED_EXTENSIONS = frozenset({TASKS_EXTENSION})


def _obj(value: object) -> JSONDict:
    """A copy of `value` if it is an object, else {}: the tables build new capability objects."""
    return dict(value) if isinstance(value, dict) else {}


def carried_extensions(caps: JSONDict) -> JSONDict | None:
    """The `extensions` member of one side's capabilities as the other side is told it: every
    declared extension with its settings object unchanged, except those the proxy translates
    itself; None when nothing is left. Both eras declare extensions the same way, in
    `capabilities.extensions` (the extensions overview: an extension applies only when both sides
    declare it, so dropping one switches it off)."""
    declared = caps.get("extensions")
    if not isinstance(declared, dict):
        return None
    carried = {name: settings for name, settings in declared.items() if name not in TRANSLATED_EXTENSIONS}
    return carried or None


# A client declares the handful of extensions it implements; a map past this is refused rather
# than carried into every upstream request and pooled-session key.
MAX_EXTENSIONS = 64


def extensions_problem(caps: JSONDict) -> str | None:
    """What is wrong with the `extensions` a client declares, for its -32602; None when nothing.
    The extensions overview: a map from extension identifiers to settings objects (`{}`: no
    settings). Identifiers are the server's to judge and pass as they are."""
    if "extensions" not in caps:
        return None
    declared = caps["extensions"]
    if not isinstance(declared, dict):
        return "capabilities.extensions must be an object mapping extension identifiers to settings objects"
    if len(declared) > MAX_EXTENSIONS:
        return f"capabilities.extensions declares {len(declared)} extensions, more than {MAX_EXTENSIONS}"
    for name, settings in declared.items():
        if not isinstance(settings, dict):
            return f"capabilities.extensions[{name[:100]!r}] must be a settings object ({{}} for none)"
    return None


def _with_extensions(out: JSONDict, caps: JSONDict) -> JSONDict:
    extensions = carried_extensions(caps)
    if extensions is not None:
        out["extensions"] = extensions
    return out


def modern_client_capabilities(legacy: object, legacy_version: str) -> JSONDict:
    """Table B: a legacy session's client capabilities as per-request modern `clientCapabilities`.

    Only what the proxy can satisfy through this client is declared: the upstream builds its
    `inputRequests` from exactly this set.
    """
    caps = _obj(legacy)
    out: JSONDict = {}
    if "roots" in caps:
        out["roots"] = {}  # modern has no roots change notification
    if "sampling" in caps:
        sampling = _obj(caps["sampling"])
        if not legacy_at_least(legacy_version, "2025-11-25"):
            sampling.pop("tools", None)
        out["sampling"] = sampling
    if "elicitation" in caps and legacy_at_least(legacy_version, "2025-06-18"):
        elicitation = _obj(caps["elicitation"])
        if not legacy_at_least(legacy_version, "2025-11-25"):
            elicitation = {}
        # An empty object means form-only in both eras.
        out["elicitation"] = elicitation if elicitation else {"form": {}}
    if isinstance(caps.get("experimental"), dict):
        out["experimental"] = caps["experimental"]
    return _with_extensions(out, caps)


def legacy_server_capabilities(modern: object, legacy_version: str, *, bridge_list_changed: bool = True) -> JSONDict:
    """Table A: an upstream modern server's capabilities as a legacy InitializeResult's."""
    caps = _obj(modern)
    out: JSONDict = {}
    for kind in ("tools", "prompts", "resources"):
        if kind in caps:
            entry = _obj(caps[kind])
            if not bridge_list_changed:
                entry.pop("listChanged", None)
            out[kind] = entry
    if "completions" in caps and legacy_at_least(legacy_version, "2025-03-26"):
        out["completions"] = _obj(caps["completions"])
    if "logging" in caps:
        out["logging"] = _obj(caps["logging"])
    if isinstance(caps.get("experimental"), dict):
        out["experimental"] = caps["experimental"]
    return _with_extensions(out, caps)


def elicitation_modes(modern_caps: object) -> frozenset[str]:
    """Elicitation modes a modern capability object allows ({} means form only)."""
    caps = _obj(modern_caps)
    if "elicitation" not in caps:
        return frozenset()
    elicitation = _obj(caps["elicitation"])
    modes = {mode for mode in ("form", "url") if mode in elicitation}
    return frozenset(modes or {"form"})


def missing_input_capability(method: str, params: object, caps: object) -> JSONDict | None:
    """What an input request (elicitation, sampling, roots) needs that the client capabilities
    `caps` do not declare, in the shape of -32021's `requiredCapabilities`; None when covered.

    One rule for both directions: a modern server must not ask for what the request did not
    declare (2026-07-28/basic/patterns/mrtr.mdx §Server Requirements), so a legacy server's request
    that needs more is refused, and a modern server's input request that needs more is its bug.
    Elicitation needs its mode (2025-11-25/client/elicitation.mdx §Capabilities; {} means form);
    sampling needs `tools` for tools/toolChoice and `context` for includeContext other than none
    (2025-11-25/client/sampling.mdx).
    """
    given, args = jsonrpc.obj(caps), jsonrpc.obj(params)  # read only: no copies
    if method == "elicitation/create":
        mode = args.get("mode", "form")
        return None if mode in elicitation_modes(given) else {"elicitation": {str(mode): {}}}
    if method == "sampling/createMessage":
        needed: JSONDict = {}
        if "tools" in args or "toolChoice" in args:
            needed["tools"] = {}
        if args.get("includeContext", "none") != "none":
            needed["context"] = {}
        sampling = given.get("sampling")
        if not isinstance(sampling, dict) or any(key not in sampling for key in needed):
            return {"sampling": needed}
        return None
    return None if "roots" in given else {"roots": {}}


def describe_required(required: JSONDict) -> str:
    """`{"sampling": {"tools": {}}}` → "sampling.tools", for error messages."""
    names: list[str] = []
    for capability, detail in required.items():
        members = list(detail) if isinstance(detail, dict) else []
        names.extend([f"{capability}.{member}" for member in members] or [capability])
    return ", ".join(names)


# Every input capability a legacy client can declare (2025-11-25): what the proxy tells a legacy
# server when it answers for whatever modern client comes (see `upstream.declare_capabilities`).
ALL_INPUT_CAPABILITIES: JSONDict = {
    "roots": {},
    "sampling": {"context": {}, "tools": {}},
    "elicitation": {"form": {}, "url": {}},
}


def legacy_client_capabilities(modern: object) -> JSONDict:
    """Table C: a modern request's `clientCapabilities` as a legacy `initialize` declares them.

    Proposed at 2025-11-25; older servers ignore members they do not know.
    """
    caps = _obj(modern)
    out: JSONDict = {}
    if "roots" in caps:
        out["roots"] = {}  # no listChanged: the proxy never learns of root changes
    if "sampling" in caps:
        out["sampling"] = _obj(caps["sampling"])
    if "elicitation" in caps:
        elicitation = _obj(caps["elicitation"])
        out["elicitation"] = {mode: _obj(elicitation[mode]) for mode in ("form", "url") if mode in elicitation} or {
            "form": {}
        }
    if isinstance(caps.get("experimental"), dict):
        out["experimental"] = caps["experimental"]
    return _with_extensions(out, caps)


def modern_server_capabilities(legacy: object) -> JSONDict:
    """A legacy InitializeResult's server capabilities in the modern shape (docs/translation.md §4.2)."""
    caps = _obj(legacy)
    out: JSONDict = {}
    for kind in ("tools", "prompts", "resources", "completions", "logging"):
        if kind in caps and caps[kind] is not None:
            out[kind] = _obj(caps[kind])
    if isinstance(caps.get("experimental"), dict):
        out["experimental"] = caps["experimental"]
    return _with_extensions(out, caps)
