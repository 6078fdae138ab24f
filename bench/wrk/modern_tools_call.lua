-- 2026-07-28 tools/call: _meta envelope in the body, MCP-Protocol-Version / Mcp-Method / Mcp-Name headers.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")
local headers = {
  ["Content-Type"] = "application/json",
  ["Accept"] = "application/json, text/event-stream",
  ["MCP-Protocol-Version"] = "2026-07-28",
  ["Mcp-Method"] = "tools/call",
  ["Mcp-Name"] = tool,
}
local template = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"' .. tool ..
  '","arguments":' .. args .. ',"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",' ..
  '"io.modelcontextprotocol/clientCapabilities":{}}}}'
function request()
  return wrk.format(nil, nil, headers, string.format(template, next_id()))
end
