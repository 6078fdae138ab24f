-- Shared by the request-shape scripts (loaded with dofile): unique JSON-RPC ids per thread,
-- and a done() that prints one machine-readable line with throughput and latency percentiles.
-- Environment: BENCH_SESSION (Mcp-Session-Id for the legacy shapes), BENCH_TOOL, BENCH_ARGS.
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

-- Ids: thread n uses n*10^9 + 1, + 2, ... so no id repeats across wrk connections or threads
-- (the proxy refuses a request id already in flight in the same legacy session).
counter = 0
function next_id()
  counter = counter + 1
  return (tid or 0) * 1000000000 + counter
end

tool = os.getenv("BENCH_TOOL") or "echo"
args = os.getenv("BENCH_ARGS") or '{"message":"hi"}'
wrk.method = "POST"

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"mean_us":%.1f,"max_us":%d,"errors_connect":%d,"errors_read":%d,"errors_write":%d,' ..
    '"errors_status":%d,"errors_timeout":%d}\n',
    summary.requests, summary.duration, summary.bytes,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    latency.mean, latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
