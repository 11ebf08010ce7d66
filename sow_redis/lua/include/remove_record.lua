--[[
  include remove_record: shared by apply.lua and expire.lua (included textually by the loader).
  Expects the partition KEYS layout: KEYS[1] records, KEYS[3] expiry, KEYS[5] ixm,
  KEYS[6] dead-letter outbox, KEYS[8..7+nidx] hash indexes; and locals chan, topic, nidx,
  listeners (false: nobody subscribes, skip the event).
]]
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
local function remove_record(key, stored, seq, reason, dead_letter)
  redis.call("HDEL", KEYS[1], key)
  redis.call("ZREM", KEYS[3], key)
  if nidx > 0 then
    local om = redis.call("HGET", KEYS[5], key)
    if om then
      local olds = split_members(om)
      for j = 1, nidx do
        if olds[j] and olds[j] ~= "" then redis.call("ZREM", KEYS[7 + j], olds[j]) end
      end
      redis.call("HDEL", KEYS[5], key)
    end
  end
  local body = string.sub(stored, string.find(stored, "\n", 1, true) + 1)
  local exp_ms, sid = header_field(stored, 2), header_field(stored, 3)
  if listeners then
    redis.call("PUBLISH", chan, '{"topic":"' .. topic .. '","op":"sow_delete","sow_key":"' ..
      key .. '","seq":' .. seq .. ',"id":"' .. sid .. '","reason":"' .. reason ..
      '","expiry_ms":' .. exp_ms .. ',"data":' .. body .. '}')
  end
  if dead_letter and reason == "expired" then
    redis.call("XADD", KEYS[6], "*", "sow_key", key, "topic", topic, "expiry_ms", exp_ms,
      "data", body)
  end
end
