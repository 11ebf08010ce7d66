--[[
  include event: the one definition of a change block (documented in sow_redis/events.py).

  The changes one atomic call makes in one partition form a change block, a flat array:
    topic, partition, first seq, last seq, server ms,
    then 7 fields per change, in order: op, SOW key, seq, log stream id, reason, expiry ms, data
  op is "publish", "delta_publish" or "sow_delete" (reason "deleted" or "expired"; "" for the
  others); data is the record's JSON text. The array is encoded with MessagePack (Redis's
  cmsgpack: strings copied once, about a third of the cost of building JSON text in Lua), or
  as a JSON array where the server's Lua has no cmsgpack (fakeredis for memory://).

  add_change(fields, op, key, seq, id, expiry_ms, data, reason) appends one change;
  encode_block(topic, partition, first, last, ms, fields) returns the encoded block.
]]
local EVENT_WIDTH = 7

local function add_change(fields, op, key, seq, id, expiry_ms, data, reason)
  local n = #fields
  fields[n + 1] = op
  fields[n + 2] = key
  fields[n + 3] = seq
  fields[n + 4] = id
  fields[n + 5] = reason or ""
  fields[n + 6] = tonumber(expiry_ms)
  fields[n + 7] = data
end

local function encode_block(topic, partition, first, last, ms, fields)
  local block = {topic, tonumber(partition), first, last, ms}
  for i = 1, #fields do block[5 + i] = fields[i] end
  if cmsgpack then return cmsgpack.pack(block) end
  return cjson.encode(block)
end
