--[[
  expire: pop the due records of one partition and run delete processing on each
  (AMPS User Guide ch. 7 "SOW Message Expiration", seeds/004 and 000; ARCHITECTURE §5).

  Due = expiry score <= the Redis server clock (TIME). The check runs inside this atomic call,
  so an update that moved a record's expiry into the future before the call wins the race.
  Each expired record leaves the SOW with its index members, a sow_delete event with reason
  "expired" is published, and with a dead_letter topic a copy goes to the outbox stream.

  Input:
    KEYS[1] records  KEYS[2] state  KEYS[3] expiry  KEYS[4] acks  KEYS[5] ixm
    KEYS[6] dead (dead-letter outbox stream)   KEYS[7] chain (unused)
    KEYS[8..7+n] hash indexes (as in apply.lua)
    ARGV[1] pub/sub channel   ARGV[2] topic name   ARGV[3] n (hash indexes)
    ARGV[4] "1" when the topic has a dead_letter topic   ARGV[5] most records to expire
  Output:
    {expired count, next due ms or -1 when none, server now ms}
]]
local chan, topic, nidx = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dead_letter, limit = ARGV[4] == "1", tonumber(ARGV[5])

local listeners = redis.call("PUBSUB", "NUMSUB", chan)[2] > 0 or
  redis.call("PUBSUB", "NUMPAT") > 0

--@include remove_record


local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call("ZRANGEBYSCORE", KEYS[3], "-inf", now, "LIMIT", 0, limit)
local seq = tonumber(redis.call("HGET", KEYS[2], "seq") or "0")
local n = 0
for _, key in ipairs(due) do
  local stored = redis.call("HGET", KEYS[1], key)
  if stored then
    seq = seq + 1
    remove_record(key, stored, seq, "expired", dead_letter)
    n = n + 1
  else
    redis.call("ZREM", KEYS[3], key)
  end
end
if n > 0 then
  redis.call("HSET", KEYS[2], "seq", seq)
end
local nxt = redis.call("ZRANGE", KEYS[3], 0, 0, "WITHSCORES")
local next_due = -1
if nxt[2] then next_due = tonumber(nxt[2]) end
return {n, next_due, now}
