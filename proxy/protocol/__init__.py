"""Pure protocol core: JSON-RPC dicts in, JSON-RPC dicts (or decisions) out.

Nothing in this package performs I/O, logs, or touches metrics; callers act on what it returns.
"""
