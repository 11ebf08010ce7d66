--[[
  load_batch: append one batch of a bulk load (sow-redis spark load / stream) to a partition's
  transaction log, exactly once.

  The batch is identified by a marker ("<load id>:<batch number>") kept in the partition's
  loads hash: a batch whose marker is there was appended before (a retried Spark task, a
  replayed micro-batch) and nothing is written. Otherwise its entries are XADDed to the log,
  its rejected rows to the partition's error stream, and the marker is set, in this one call. The
  entries are then applied by the workers' own path (lease, fencing token, apply scripts).

  Input:
    KEYS[1] the partition's log   KEYS[2] the partition's loads hash   KEYS[3] the partition's error stream
    ARGV[1] marker
    ARGV[2] MessagePack (unpacked with Redis's cmsgpack) of [entries, rejected rows]: each
            entry an array of its field names and values in turn, each rejected row
            [reason, detail, data]. One packed argument instead of one per field: the client
            packs a batch in one C call (redis-py's per-argument packing was a fifth of a
            load task's time).
  Output:
    {entries appended, last stream id} or {-1, ""} when the batch was appended before.
]]
local marker = ARGV[1]
if redis.call("HEXISTS", KEYS[2], marker) == 1 then
  return {-1, ""}
end
local batch = cmsgpack.unpack(ARGV[2])
local entries, rejects = batch[1], batch[2]
local last = ""
for i = 1, #entries do
  last = redis.call("XADD", KEYS[1], "*", unpack(entries[i]))
end
for i = 1, #rejects do
  local rej = rejects[i]
  redis.call("XADD", KEYS[3], "MAXLEN", "~", 100000, "*", "reason", rej[1],
    "detail", rej[2], "data", rej[3], "load", marker)
end
redis.call("HSET", KEYS[2], marker, last)
return {#entries, last}
