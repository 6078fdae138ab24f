"""Every `.Values.x.y` path a chart template uses exists in values.yaml, and every key of
values.yaml is documented with a helm-docs `# --` comment (on itself or on an enclosing key).
Needs PyYAML only.

    python scripts/check_values_paths.py

A path may go deeper than values.yaml where values.yaml holds an empty map (a free-form block such
as `config: {}` or `podAnnotations: {}`); a path into a list or a scalar is an error.
"""

from __future__ import annotations

import re
import sys

from chart_values import CHART, defaults

VALUES_PATH = re.compile(r"(?<![\w$])\$?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
KEY_LINE = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_][A-Za-z0-9_.\-/]*|\"[^\"]+\"):(?:\s|$)")


def template_paths() -> dict[tuple[str, ...], list[str]]:
    """Each values path used by the templates, with where ('file:line')."""
    found: dict[tuple[str, ...], list[str]] = {}
    for path in sorted((CHART / "templates").iterdir()):
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in VALUES_PATH.finditer(line):
                keys = tuple(match.group(1).lstrip(".").split("."))
                found.setdefault(keys, []).append(f"{path.name}:{number}")
    return found


def resolve(values: object, keys: tuple[str, ...]) -> str | None:
    """None when the path exists; else why not."""
    node = values
    for depth, key in enumerate(keys):
        if isinstance(node, dict):
            if key in node:
                node = node[key]
                continue
            if not node and depth > 0:  # an empty map: free-form below this point
                return None
            return f"no key {key!r} under {'.'.join(keys[:depth]) or 'the root'}"
        return f"{'.'.join(keys[:depth])} is a {type(node).__name__}, not a map"
    return None


def undocumented_keys(text: str) -> list[str]:
    """Leaf keys of values.yaml with no `# --` comment on them or on an enclosing key. Keys inside
    list items (the default of a list) are covered by the list's own comment."""
    missing = []
    stack: list[tuple[int, str, bool]] = []  # (indent, key, documented here or above)
    comments: list[str] = []
    list_indent: int | None = None  # inside the items of a list whose dashes are at this indent
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped:
            comments = []
            continue
        if stripped.startswith("#"):
            comments.append(stripped)
            continue
        indent = len(line) - len(line.lstrip(" "))
        if list_indent is not None:
            if indent > list_indent or (indent == list_indent and stripped.startswith("- ")):
                comments = []
                continue
            list_indent = None
        if stripped.startswith("- "):
            list_indent = indent
            comments = []
            continue
        match = KEY_LINE.match(line)
        if not match:
            comments = []
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match.group("key").strip('"')
        documented = any(c.startswith("# --") for c in comments) or bool(stack and stack[-1][2])
        if not documented and _is_leaf(line):
            missing.append(f"values.yaml:{number}: {'.'.join([k for _, k, _ in stack] + [key])}")
        stack.append((indent, key, documented))
        comments = []
    return missing


def _is_leaf(line: str) -> bool:
    """A key with a value on its own line (scalar, `{}`, `[]`); a bare `key:` opens a block whose
    own keys are checked instead (it may still carry the comment for all of them)."""
    value = line.split(":", 1)[1].strip()
    return bool(value) and not value.startswith("#")


def main() -> int:
    values = defaults()
    failed = False
    used = template_paths()
    if not used:
        print("FAIL no .Values paths found in the templates", file=sys.stderr)
        return 1
    for keys, where in sorted(used.items()):
        problem = resolve(values, keys)
        if problem:
            failed = True
            print(f"FAIL .Values.{'.'.join(keys)} ({', '.join(where)}): {problem}")
    if not failed:
        print(f"ok   values paths: {len(used)} distinct .Values paths in the templates all exist in values.yaml")
    missing = undocumented_keys((CHART / "values.yaml").read_text(encoding="utf-8"))
    for entry in missing:
        print(f"FAIL undocumented (no '# --' comment): {entry}")
    if not missing:
        print("ok   values docs: every key of values.yaml has a '# --' comment (or an enclosing key has)")
    return 1 if failed or missing else 0


if __name__ == "__main__":
    sys.exit(main())
