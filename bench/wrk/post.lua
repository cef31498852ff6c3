-- wrk script: POST one AdmissionReview body, read from a file, with a fresh request uid per request.
--   wrk ... -s bench/wrk/post.lua https://127.0.0.1:PORT -- /mutate body.json [close]
-- The body must contain the placeholder uid below exactly once; "close" adds "Connection: close" so that every
-- request opens a new connection. done() prints one JSON line (latencies in microseconds) for bench.https_bench.

local placeholder = "00000000-0000-4000-8000-000000000000"
local path, prefix, suffix
local headers = {["Content-Type"] = "application/json"}
local counter = 0

function init(args)
   path = args[1]
   local file = assert(io.open(args[2], "rb"))
   local body = file:read("*a")
   file:close()
   local first, last = body:find(placeholder, 1, true)
   assert(first, "the body has no placeholder uid")
   prefix, suffix = body:sub(1, first - 1), body:sub(last + 1)
   if args[3] == "close" then
      headers["Connection"] = "close"
   end
end

function request()
   counter = counter + 1
   local uid = string.format("00000000-0000-4000-8000-%012d", counter)
   return wrk.format("POST", path, headers, prefix .. uid .. suffix)
end

function done(summary, latency, requests)
   local errors = summary.errors
   io.write(string.format(
      '{"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,' ..
      '"timeout":%d},"latency_us":{"p50":%d,"p90":%d,"p99":%d,"max":%d,"mean":%.1f}}\n',
      summary.requests, summary.duration, summary.bytes, errors.connect, errors.read, errors.write, errors.status,
      errors.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      latency.mean))
end
