--[[
  include write_record: the upsert of one record, shared by apply.lua (ops planned by the
  worker) and apply_log.lua (plain publishes read from the log by the script itself), so both
  write records, expiry scores, hash-index members and change events the same way. Included
  after include event and include remove_record (batch state S: see there).
]]
local DEFERRED_MAX = 1000  -- fields and values of one HSET (well below Lua's stack limit)

-- Write the records deferred by upsert in one HSET. Deferring (S.deferred = {}) is for a
-- caller whose batch reads no record it writes (apply_log.lua: publishes only, on a topic
-- without expiration); it must call this before it returns.
local function write_deferred(P, S)
  if S.deferred and #S.deferred > 0 then
    -- the reply counts the fields that were new: the inserts among these upserts (a key
    -- written twice in the batch counts once as an insert, once as an update)
    S.inserts = S.inserts + redis.call("HSET", P.rec, unpack(S.deferred))
    S.deferred = {}
  end
end

-- the ms part of a stream id "<ms>-<n>"
local function id_ms(id)
  return tonumber(string.match(id, "^(%d+)-"))
end

-- The stored record of key as seen by an entry logged at id: nil when absent, or when it was
-- due at or before that time (then it is first removed as an expiry, with event and dead letter).
local function live_record(P, S, key, id)
  local old = redis.call("HGET", P.rec, key)
  if old and S.expiring then
    local exp_ms = tonumber(header_field(old, 2))
    if exp_ms > 0 and exp_ms <= id_ms(id) then
      remove_record(P, S, key, old, "expired", nil)
      return nil
    end
  end
  return old
end

-- Store data as the record of key, written by the log entry id with op "publish" or
-- "delta_publish" (data already merged). ex: "" (no expiry), "now" (TTL 0: delivered to
-- current subscribers, then removed as expired) or absolute expiry ms as text. members:
-- the positional, comma-separated hash-index members.
local function upsert(P, S, op, id, key, data, ex, members)
  if S.expiring then live_record(P, S, key, id) end
  local exp_ms = ex
  if ex == "" then exp_ms = "0" elseif ex == "now" then exp_ms = string.match(id, "^(%d+)") end
  emit(S, op, key, id, exp_ms, data, nil)
  local stored = S.seq .. ":" .. exp_ms .. ":" .. id .. "\n" .. data
  local deferred = S.deferred
  if deferred then
    deferred[#deferred + 1] = key
    deferred[#deferred + 1] = stored
    if #deferred >= DEFERRED_MAX then write_deferred(P, S) end
  else
    S.inserts = S.inserts + redis.call("HSET", P.rec, key, stored)
  end
  if ex ~= "" then
    redis.call("ZADD", P.exp, exp_ms, key)
    S.has_expiry = true
  elseif S.has_expiry then
    redis.call("ZREM", P.exp, key)
  end
  local nidx = #P.idx
  if nidx > 0 then
    local om = redis.call("HGET", P.ixm, key)
    if om ~= members then
      local news = split_members(members)
      local olds = {}
      if om then olds = split_members(om) end
      for j = 1, nidx do
        if olds[j] ~= news[j] then
          if olds[j] and olds[j] ~= "" then redis.call("ZREM", P.idx[j], olds[j]) end
          if news[j] and news[j] ~= "" then redis.call("ZADD", P.idx[j], 0, news[j]) end
        end
      end
      redis.call("HSET", P.ixm, key, members)
    end
  end
  if ex == "now" then
    -- TTL 0 (expiration_policy "min"): delivered to current subscribers, never kept
    remove_record(P, S, key, stored, "expired", nil)
  end
end
