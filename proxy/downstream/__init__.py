"""Downstream side: what MCP clients connect to."""
