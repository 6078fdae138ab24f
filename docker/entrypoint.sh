#!/bin/sh
# The images' entrypoint (Dockerfile, docker/Dockerfile.node): mcp-era-proxy with the arguments the
# container was given. Given none, it reads the config file mounted at CONFIG when there is one,
# and is configured by its MCP_ERA_PROXY_* environment alone when there is none
# (docs/operate/docker.md). Anything at CONFIG is passed on, so that what is not a readable file
# there (a directory Docker made for a missing host file) fails with the proxy's own message.
set -eu
CONFIG=/etc/mcp-era-proxy/config.yaml
if [ "$#" -eq 0 ] && [ -e "$CONFIG" ]; then
  set -- --config "$CONFIG"
fi
exec mcp-era-proxy "$@"
