--[[
  rebuild: start rebuilding the SOW of a transient topic's partition from its transaction log,
  when the SOW was lost (issue 25, item 2; AMPS SOW Durability "transient" and RecoveryPoint,
  seeds/004). Run by a worker under the partition's lease (sow_redis.apply.rebuild), before
  it applies anything.

  The SOW is lost when the partition's state hash has no "cursor": apply.lua writes it in the
  same atomic call as every record change, and config apply sets it ("0-0") for each
  partition of a transient topic, so a partition emptied by deletes, or one nothing was
  applied to yet, still has it; a partition whose records and state were removed (a Redis
  that kept no RDB/AOF of them, a FLUSH or DEL of them, an eviction) does not.

  Then the remnants of the SOW (records, expiry set, index members, hash indexes, chain
  table, sow_delete acks) are removed, and the cursor is set to the recovery point: "0"
  (epoch) before the log's first retained entry ("0-0"), "now" at the log's last entry (the
  SOW starts empty), or a time in ms: the last entry before it (the rebuild applies the first
  entry at or after it onwards). The worker then applies the log through apply.lua as ever
  (every entry verified; a bad one goes to the error stream). The state's "seq" goes on from
  the change feed's last block (the seqs stay unique for bookmarks), and "rebuild_to" holds
  the log's last entry now: the entries up to it are replayed without change events
  (include apply_prepared quiet_rebuild). "rebuilt_ms" is the server time of the rebuild.

  Input: the partition's KEYS and ARGV head (include partition; ARGV[1] "rebuild"), then
    ARGV[OP + 1] fencing token   ARGV[OP + 2] recovery point: "now" or ms since the epoch
    ("0": epoch)
  Output: {started, cursor, horizon}: started 1 when the SOW was lost and the rebuild set
    the cursor (horizon: the log's last entry, "0-0" for an empty log), 0 when the partition
    has its cursor (then cursor is it, horizon ""). Error reply "SOW_FENCED …" (stale token),
    "SOW_BADARGS …" (a recovery point that is no time).
]]
--@include partition

local P = partition_context()
local fence, point = ARGV[OP + 1], ARGV[OP + 2]
local meta = redis.call("HMGET", P.state, "fence", "cursor", "seq")
if meta[1] ~= fence then
  return redis.error_reply("SOW_FENCED token " .. fence .. " is stale")
end
if meta[2] then return {0, meta[2], ""} end
if point ~= "now" and not string.match(point, "^%d+$") then
  return redis.error_reply("SOW_BADARGS recovery point " .. point)
end

redis.call("DEL", P.rec, P.exp, P.ixm, P.chain, P.acks)
for j = 1, P.nidx do
  redis.call("DEL", P.idx[j])
  if P.num[j] then redis.call("DEL", P.num[j]) end
end

local horizon = "0-0"
local last = redis.call("XREVRANGE", P.log, "+", "-", "COUNT", 1)
if last[1] then horizon = last[1][1] end
local cursor = "0-0"
if point == "now" then
  cursor = horizon
elseif point ~= "0" then
  local before = redis.call("XREVRANGE", P.log, "(" .. point .. "-0", "-", "COUNT", 1)
  if before[1] then cursor = before[1][1] end
end

-- the change feed's last seq: the last block's header (include event: topic, partition,
-- first seq, last seq, …); read from Redis, so checked, else its id's first seq
local seq = tonumber(meta[3] or "0") or 0
local tail = redis.call("XREVRANGE", P.changes, "+", "-", "COUNT", 1)
if tail[1] then
  local first = tonumber(string.match(tail[1][1], "^(%d+)-")) or 0
  local top = first
  local raw = tail[1][2][2]
  local ok, block = pcall(function()
    if cmsgpack then return cmsgpack.unpack(raw) end
    return cjson.decode(raw)
  end)
  if ok and type(block) == "table" then
    local n = tonumber(block[4])
    if n and n >= first and n == math.floor(n) then top = n end
  end
  if top > seq then seq = top end
end

local t = redis.call("TIME")
redis.call("HSET", P.state, "cursor", cursor, "seq", string.format("%d", seq),
  "rebuild_to", horizon,
  "rebuilt_ms", string.format("%d", tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)))
return {1, cursor, horizon}
