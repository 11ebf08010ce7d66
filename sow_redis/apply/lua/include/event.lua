--[[
  include event: the one definition of a change block (documented in sow_redis/model/events.py).

  The changes one atomic call makes in one partition form a change block, a flat array:
    topic, partition, first seq, last seq, server ms,
    then 8 fields per change, in order: op, SOW key, seq, log stream id, reason, expiry ms,
    data, previous
  op is "publish", "delta_publish" or "sow_delete" (reason "deleted" or "expired"; "" for the
  others); data is the record's JSON text; previous is, on a topic with change_previous, the
  record's JSON text before a publish or delta_publish ("null" when there was none; the
  stored text, "<header>\n<JSON>", when read from the SOW: the reader strips the header; on a
  topic that keeps history, only what differs: include reverse_delta), and ""
  otherwise (a removal's data is the removed record: its previous state). The array is encoded with MessagePack (Redis's
  cmsgpack: strings copied once, about a third of the cost of building JSON text in Lua), or
  as a JSON array where the server's Lua has no cmsgpack (fakeredis for memory://).

  add_change(fields, op, key, seq, id, expiry_ms, data, reason, previous) appends one change;
  encode_block(topic, partition, first, last, ms, fields) returns the encoded block;
  feed_keep_from(changes, first, min_seq) is where the change feed's retention by count cuts.
]]
local EVENT_WIDTH = 8

local function add_change(fields, op, key, seq, id, expiry_ms, data, reason, previous)
  local n = #fields
  fields[n + 1] = op
  fields[n + 2] = key
  fields[n + 3] = seq
  fields[n + 4] = id
  fields[n + 5] = reason or ""
  fields[n + 6] = tonumber(expiry_ms)
  fields[n + 7] = data
  fields[n + 8] = previous or ""
end

local function encode_block(topic, partition, first, last, ms, fields)
  local block = {topic, tonumber(partition), first, last, ms}
  for i = 1, #fields do block[5 + i] = fields[i] end
  if cmsgpack then return cmsgpack.pack(block) end
  return cjson.encode(block)
end

-- Retention by count keeps the last changes, in whole blocks: the oldest block kept is the one
-- holding change min_seq (a block's stream id is "<first seq>-0"): the new block itself when it
-- starts at or below min_seq, else the feed's last block at or below it. Returns that block's
-- id and first seq (the MINID to trim to), or nil when nothing is to be trimmed.
local function feed_keep_from(changes, first, min_seq)
  if min_seq <= 1 then return nil end
  if first <= min_seq then return string.format("%d", first) .. "-0", first end
  local below = redis.call("XREVRANGE", changes, string.format("%d", min_seq) .. "-0", "-",
    "COUNT", 1)
  if not below[1] then return nil end
  return below[1][1], tonumber(string.match(below[1][1], "^%d+"))
end
