"""mcp-era-proxy: a reverse proxy that lets MCP clients and servers of either protocol era talk."""

__version__ = "0.1.0"
