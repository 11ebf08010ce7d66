--[[
  expire: pop the due records of one partition and run delete processing on each
  (AMPS User Guide ch. 7 "SOW Message Expiration", seeds/004 and 000; ARCHITECTURE §5).

  Due = expiry score <= the Redis server clock (TIME). The check runs inside this atomic call,
  so an update that moved a record's expiry into the future before the call wins the race.
  Every log entry sees the SOW as of its own log time, so a record is not removed while its
  partition still holds unapplied log entries logged before its due time (they must still
  see it): only records due at or before the first unapplied entry's time are removed here;
  the worker expires the others itself when it reaches entries logged after their due time.
  Each expired record leaves the SOW with its index members, a sow_delete change with reason
  "expired" is published (one change block for the call, also in the change feed), and with
  a dead_letter topic a copy goes to the outbox stream.

  Input: the partition's KEYS and ARGV head (include partition; ARGV[1] "expire"), then
    ARGV[OP + 1] most records to expire
  Output:
    {expired count, next due ms or -1 when none, server now ms, dead-letter outbox length}
    (next due is at least now + 5 while due records wait for the workers)
]]
--@include partition
--@include expiry
--@include event
--@include remove_record

local P = partition_context()
local limit = tonumber(ARGV[OP + 1])
local now = now_ms()
local horizon = now
local cursor = redis.call("HGET", P.state, "cursor") or "0-0"
local pending = redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", 1)
if pending[1] then
  local logged = tonumber(string.match(pending[1][1], "^(%d+)"))
  if logged < horizon then horizon = logged end
end
local due = due_keys(P, horizon, limit)
local S = batch_state(P, tonumber(redis.call("HGET", P.state, "seq") or "0"), true,
  P.dead_letter, P.keep_count, P.keep_ms)
S.now = now
local n = 0
for _, key in ipairs(due) do
  local stored = redis.call("HGET", P.rec, key)
  if stored then
    remove_record(P, S, key, stored, "expired", nil)
    n = n + 1
  else
    redis.call("ZREM", P.exp, key)
  end
end
if n > 0 then
  redis.call("HSET", P.state, "seq", S.seq)
  publish_changes(P, S)
end
local nxt = redis.call("ZRANGE", P.exp, 0, 0, "WITHSCORES")
local next_due = -1
if nxt[2] then
  next_due = tonumber(nxt[2])
  if next_due <= now then next_due = now + 5 end
end
return {n, next_due, now, redis.call("XLEN", P.dead)}
