--[[
  include remove_record: record helpers shared by apply.lua and expire.lua (included textually
  by the loader, after include event). Every function takes the partition context P as a
  parameter, built by partition_context() from the scripts' common KEYS layout:
    KEYS[1] records  KEYS[2] state  KEYS[3] expiry  KEYS[4] acks  KEYS[5] ixm
    KEYS[6] dead-letter outbox  KEYS[7] chain  KEYS[8] errors  KEYS[9] log
    KEYS[10..9+n] hash indexes
]]
local function partition_context(chan, topic, nidx)
  local idx = {}
  for j = 1, nidx do idx[j] = KEYS[9 + j] end
  return {
    rec = KEYS[1], state = KEYS[2], exp = KEYS[3], acks = KEYS[4], ixm = KEYS[5],
    dead = KEYS[6], chain = KEYS[7], errors = KEYS[8], log = KEYS[9], idx = idx,
    chan = chan, topic = topic,
    -- nobody subscribes: skip building and publishing events
    listeners = redis.call("PUBSUB", "NUMSUB", chan)[2] > 0 or
      redis.call("PUBSUB", "NUMPAT") > 0,
  }
end

-- positional split on ","; an empty slot means "no member in that index"
local function split_members(s)
  local out, start = {}, 1
  while true do
    local c = string.find(s, ",", start, true)
    if not c then
      out[#out + 1] = string.sub(s, start)
      return out
    end
    out[#out + 1] = string.sub(s, start, c - 1)
    start = c + 1
  end
end

-- field n (1 seq, 2 expiry ms, 3 stream id) of a stored record's header
local function header_field(stored, n)
  local head = string.sub(stored, 1, string.find(stored, "\n", 1, true) - 1)
  local i = 0
  for part in string.gmatch(head, "[^:]+") do
    i = i + 1
    if i == n then return part end
  end
end

-- Remove a stored record with its expiry score and index members, publish a sow_delete event
-- with the reason, and (reason "expired", dead_letter on) queue a dead-letter copy.
-- cause_id: the log entry that removed it (a sow_delete); nil for an expiry, whose event
-- carries the id of the entry that last wrote the record (and so set its expiry).
local function remove_record(P, key, stored, seq, reason, cause_id, dead_letter)
  redis.call("HDEL", P.rec, key)
  redis.call("ZREM", P.exp, key)
  if #P.idx > 0 then
    local om = redis.call("HGET", P.ixm, key)
    if om then
      local olds = split_members(om)
      for j = 1, #P.idx do
        if olds[j] and olds[j] ~= "" then redis.call("ZREM", P.idx[j], olds[j]) end
      end
      redis.call("HDEL", P.ixm, key)
    end
  end
  local body = string.sub(stored, string.find(stored, "\n", 1, true) + 1)
  local exp_ms = header_field(stored, 2)
  if P.listeners then
    redis.call("PUBLISH", P.chan, change_event(P.topic, "sow_delete", key, seq,
      cause_id or header_field(stored, 3), exp_ms, body, reason))
  end
  if dead_letter and reason == "expired" then
    redis.call("XADD", P.dead, "*", "sow_key", key, "topic", P.topic, "expiry_ms", exp_ms,
      "data", body)
  end
end
