-- Legacy (2025-11-25) tools/call inside an initialized session: BENCH_SESSION is its Mcp-Session-Id.
dofile(debug.getinfo(1, "S").source:match("^@(.*/)") .. "common.lua")
local session = os.getenv("BENCH_SESSION") or error("set BENCH_SESSION to an initialized Mcp-Session-Id")
local headers = {
  ["Content-Type"] = "application/json",
  ["Accept"] = "application/json, text/event-stream",
  ["MCP-Protocol-Version"] = "2025-11-25",
  ["Mcp-Session-Id"] = session,
}
local template = '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"' .. tool ..
  '","arguments":' .. args .. '}}'
function request()
  return wrk.format(nil, nil, headers, string.format(template, next_id()))
end
