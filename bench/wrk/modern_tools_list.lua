-- 2026-07-28 tools/list (cacheable when the upstream says ttlMs > 0 and cacheScope public).
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")
local headers = {
  ["Content-Type"] = "application/json",
  ["Accept"] = "application/json, text/event-stream",
  ["MCP-Protocol-Version"] = "2026-07-28",
  ["Mcp-Method"] = "tools/list",
}
local template = '{"jsonrpc":"2.0","id":%d,"method":"tools/list","params":{"_meta":' ..
  '{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}'
function request()
  return wrk.format(nil, nil, headers, string.format(template, next_id()))
end
