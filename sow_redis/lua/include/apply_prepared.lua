--[[
  include apply_prepared: upsert the plain publishes prepared by sow_redis's publisher at the
  head of a list of log entries (XRANGE reply), in log order, stopping before the first entry
  that is anything else. Shared by apply_log.lua (the worker, under its fencing token) and
  apply_appended.lua (the publisher, in the write that appended the entries), so both apply a
  prepared publish exactly the same way. Included after include write_record.

  A prepared publish: cmd "publish", the SOW key the publisher computed (field "k"), a body
  braced like a JSON object, index members (field "m") when the topic has hash indexes, and no
  message expiration of its own (see sow_redis/entries.py).

  apply_prepared(P, S, entries, ttl, nidx) → applied, cursor (nil when none applied), stopped
    ttl: the topic's expiry of a message without its own: "" (none), "now" (TTL 0) or a
         lifetime in ms added to the entry's stream id time
    stopped: true when it stopped before an entry the worker must plan (apply.lua)
]]
local function apply_prepared(P, S, entries, ttl, nidx)
  local ttl_ms = tonumber(ttl)
  local applied, cursor = 0, nil
  for _, entry in ipairs(entries) do
    local id, f = entry[1], entry[2]
    local cmd, data, key, members, own_expiry
    for j = 1, #f, 2 do
      local name = f[j]
      if name == "cmd" then cmd = f[j + 1]
      elseif name == "data" then data = f[j + 1]
      elseif name == "k" then key = f[j + 1]
      elseif name == "m" then members = f[j + 1]
      elseif name == "expiration" then own_expiry = true
      end
    end
    if cmd ~= "publish" or not key or key == "" or not data or own_expiry
        or string.byte(data, 1) ~= 123 or string.byte(data, -1) ~= 125
        or (nidx > 0 and not members) then
      return applied, cursor, true
    end
    local ex = ttl
    if ttl_ms then ex = string.format("%d", id_ms(id) + ttl_ms) end
    upsert(P, S, "publish", id, key, data, ex, members or "")
    cursor = id
    applied = applied + 1
  end
  return applied, cursor, false
end

-- Finish a batch of apply_prepared: one HSET of the deferred records, the cursor and sequence,
-- the change block.
local function finish_prepared(P, S, cursor)
  write_deferred(P, S)
  redis.call("HSET", P.state, "cursor", cursor, "seq", S.seq)
  publish_changes(P, S)
end
