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
  nothing is written. Nor is anything written during a shape migration, or when the
  partition stores another definition of the topic than the caller's (include partition
  definition_refused; none stored, as before issue 23.4, is taken).

  Trust: the SOW keys come from the caller, who may run scripts (a sow_redis client with the
  writer's rights); they are removed as named, as a worker removes the keys of a sow_delete
  by keys.

  Input: the partition's KEYS and ARGV head (include partition; ARGV[1] "delete_now"), then
    ARGV[OP + 1] the log entry: MessagePack (cmsgpack) flat array of its field names and
             values
    ARGV[OP + 2 ..] the SOW keys to remove

  Output:
    {records removed, stream id of the entry} or {-1, ""} when the log holds unapplied
    entries (nothing written), {-2, ""} during a shape migration (nothing written).
]]
--@include partition
--@include expiry
--@include event
--@include remove_record
--@include reverse_delta
--@include write_record

local P = partition_context()
local why = definition_refused(P)
if why and why ~= "absent" then
  return {-2, ""}
end
local meta = redis.call("HMGET", P.state, "cursor", "seq")
local cursor = meta[1] or "0-0"
if #redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", 1) > 0 then
  return {-1, ""}
end

local id = redis.call("XADD", P.log, "*", unpack(cmsgpack.unpack(ARGV[OP + 1])))
local S = batch_state(P, tonumber(meta[2] or "0"), P.expiring, P.dead_letter, P.keep_count,
  P.keep_ms)
local removed = 0
for i = OP + 2, #ARGV do
  local old = live_record(P, S, ARGV[i], id)
  if old then
    remove_record(P, S, ARGV[i], old, "deleted", id)
    redis.call("HINCRBY", P.acks, id, 1)
    removed = removed + 1
  end
end
ack_entry(P, id)
redis.call("HSET", P.state, "cursor", id, "seq", S.seq)
publish_changes(P, S)
return {removed, id}
