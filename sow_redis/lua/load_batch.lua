--[[
  load_batch: append one batch of a bulk load (sow-redis spark load / stream) to a partition's
  transaction log, exactly once.

  The batch is identified by a marker ("<load id>:<batch number>") kept in the partition's
  loads hash: a batch whose marker is there was appended before (a retried Spark task, a
  replayed micro-batch) and nothing is written. Otherwise its entries are XADDed to the log,
  its rejected rows to the topic's error stream, and the marker is set, in this one call. The
  entries are then applied by the workers' own path (lease, fencing token, apply scripts).

  Input:
    KEYS[1] the partition's log   KEYS[2] the partition's loads hash   KEYS[3] error stream
    ARGV[1] marker   ARGV[2] n (entries)   ARGV[3] e (rejected rows)
    then per entry: the number of fields f, then f names and values in turn
    then per rejected row: reason, detail, data
  Output:
    {entries appended, last stream id} or {-1, ""} when the batch was appended before.
]]
local marker, n, e = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
if redis.call("HEXISTS", KEYS[2], marker) == 1 then
  return {-1, ""}
end
local i, last = 4, ""
for _ = 1, n do
  local f = tonumber(ARGV[i])
  local args = {KEYS[1], "*"}
  for j = 1, 2 * f do args[2 + j] = ARGV[i + j] end
  last = redis.call("XADD", unpack(args))
  i = i + 1 + 2 * f
end
for _ = 1, e do
  redis.call("XADD", KEYS[3], "MAXLEN", "~", 100000, "*", "reason", ARGV[i],
    "detail", ARGV[i + 1], "data", ARGV[i + 2], "load", marker)
  i = i + 3
end
redis.call("HSET", KEYS[2], marker, last)
return {n, last}
