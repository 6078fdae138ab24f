"""The relay executes what the protocol core decides: it owns sessions, upstream calls and streams."""
