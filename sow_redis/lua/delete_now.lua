#!lua flags=allow-oom
--[[
  delete_now: a sow_delete by SOW keys appended to a caught-up partition's log and applied in
  the same call, also when Redis refuses writes for want of memory (maxmemory under
  noeviction): the script is flagged allow-oom, so the append that every other path needs
  (and that Redis then refuses) does not keep a user from freeing memory (issue 23, item 9).
  The publisher uses it only after Redis refused the plain append of a delete as out of
  memory.

  The delete is applied as apply.lua applies it (include remove_record: the record leaves the
  SOW with its expiry score and index members, a "deleted" change event, the delete counted
  at its stream id in the acks hash), only when the log holds no unapplied entry: an entry
  before it may need memory to apply and must be applied first, in log order. Otherwise
  nothing is written. During a shape migration nothing is written either.

  Trust: the SOW keys come from the caller, who may run scripts (a sow_redis client with the
  writer's rights); they are removed as named, as a worker removes the keys of a sow_delete
  by keys.

  Input:
    KEYS: the partition layout of include/remove_record (records, state, expiry, acks, ixm,
          dead, chain, errors, log, changes, change times, hash indexes), then the
          partition's lease
    ARGV[1] partition channel   ARGV[2] topic name     ARGV[3] n (number of hash indexes)
    ARGV[4] "1" when the topic has a dead_letter topic
    ARGV[5] "1" when the topic's expiration is enabled     ARGV[6] partition number
    ARGV[7] change feed retention: changes kept per partition (0: no feed, pub/sub only)
    ARGV[8] change feed retention in ms (0: by count only)
    ARGV[9] the log entry: MessagePack (cmsgpack) flat array of its field names and values
    ARGV[10..] the SOW keys to remove

  Output:
    {records removed, stream id of the entry} or {-1, ""} when the log holds unapplied
    entries (nothing written), {-2, ""} during a shape migration (nothing written).
]]
local chan, topic, nidx = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dead_letter, expiring, partition = ARGV[4] == "1", ARGV[5] == "1", ARGV[6]

--@include event
--@include remove_record
--@include write_record

local P = partition_context(chan, topic, partition, nidx)
local owner = redis.call("GET", KEYS[12 + nidx])
if owner and string.sub(owner, 1, 8) == "migrate:" then
  return {-2, ""}
end
local meta = redis.call("HMGET", P.state, "cursor", "seq")
local cursor = meta[1] or "0-0"
if #redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", 1) > 0 then
  return {-1, ""}
end

local id = redis.call("XADD", P.log, "*", unpack(cmsgpack.unpack(ARGV[9])))
local S = batch_state(P, tonumber(meta[2] or "0"), expiring, dead_letter, ARGV[7], ARGV[8])
local removed = 0
for i = 10, #ARGV do
  local old = live_record(P, S, ARGV[i], id)
  if old then
    remove_record(P, S, ARGV[i], old, "deleted", id)
    redis.call("HINCRBY", P.acks, id, 1)
    removed = removed + 1
  end
end
redis.call("HSETNX", P.acks, id, 0)
redis.call("PEXPIRE", P.acks, 3600000)
redis.call("HSET", P.state, "cursor", id, "seq", S.seq)
publish_changes(P, S)
return {removed, id}
