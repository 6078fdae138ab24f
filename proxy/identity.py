"""How the proxy names itself to peers (serverInfo, clientInfo)."""

from __future__ import annotations

from . import __version__

PROXY_INFO = {"name": "mcp-era-proxy", "version": __version__}
