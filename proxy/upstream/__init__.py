"""Upstream side: clients that talk to the MCP server behind the proxy."""
