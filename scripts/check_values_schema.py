"""The chart's values.schema.json is a valid draft-07 schema, strict, and accepts values.yaml and
every examples/*.yaml and every values snippet of docs/operate/kubernetes.md merged over it (as
Helm merges them). Needs PyYAML and jsonschema.

    python scripts/check_values_schema.py
"""

from __future__ import annotations

import json
import sys

from chart_values import CHART, EXAMPLES, cases, coalesce, defaults, documented_cases
from jsonschema import Draft7Validator


def errors(validator: Draft7Validator, values: dict) -> list[str]:
    found = sorted(validator.iter_errors(values), key=lambda e: list(e.absolute_path))
    return [f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in found]


def main() -> int:
    schema = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
    Draft7Validator.check_schema(schema)
    validator = Draft7Validator(schema)
    failed = False
    if not EXAMPLES:
        print("no examples under helm/mcp-era-proxy/examples", file=sys.stderr)
        return 1
    snippets = documented_cases()
    if not snippets:
        print("no yaml blocks found in docs/operate/kubernetes.md", file=sys.stderr)
        return 1
    base = defaults()
    for name, values in [("values.yaml", base), *cases(), *snippets]:
        problems = errors(validator, values)
        print(f"{'ok  ' if not problems else 'FAIL'} schema: {name}")
        for problem in problems:
            print(f"       {problem}")
        failed |= bool(problems)
    # The schema is strict: a misspelt key, a wrong type or an unknown mode must be refused.
    for label, bad in [
        ("unknown top-level key", {"replica": 2}),
        ("unknown nested key", {"service": {"prot": 80}}),
        ("unknown proxy config section", {"config": {"upstreams": {}}}),
        ("wrong type", {"replicaCount": "1"}),
        ("unknown mode", {"mode": "daemonset"}),
        ("short session key", {"sessionSecret": {"value": "too-short"}}),
        ("store URL as a value", {"store": {"url": "redis://redis:6379/0"}}),
        ("internal port out of range", {"replicas": {"internalPort": 70000}}),
    ]:
        if not errors(validator, coalesce(base, bad)):
            print(f"FAIL schema accepts bad values ({label}): {bad}")
            failed = True
    if not failed:
        print("ok   schema: refuses unknown keys, wrong types, unknown modes, short session keys, bad store values")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
