--[[
  include apply_prepared: upsert the plain publishes prepared by sow_redis's publisher at the
  head of a list of log entries (XRANGE reply), in log order, stopping before the first entry
  that is anything else. Shared by apply.lua (log) (the worker, under its fencing token) and
  apply.lua (appended) (the publisher, in the write that appended the entries), so both apply a
  prepared publish exactly the same way. Included after include write_record.

  A prepared publish: cmd "publish", the SOW key the publisher computed (field "k"), a body
  braced like a JSON object, index members (field "m") when the topic has hash indexes, and no
  message expiration of its own (see sow_redis/model/entries.py).

  apply_prepared(P, S, entries, ttl, nidx, accept) → applied, cursor (nil when none applied),
    stopped
    ttl: the topic's expiry of a message without its own: "" (none), "now" (TTL 0) or a
         lifetime in ms added to the entry's stream id time
    accept: nil (the caller appended the entries itself) or a function of a stream id that
         says whether the entry may be applied without the worker (apply.lua (log): inside a
         trusted range, or verified by the worker)
    stopped: true when it stopped before an entry the worker must plan (apply.lua)

  Trusted ranges (KEYS of the caller, sow_redis/keys.py trusted): the entries a caller with
  the right to run scripts appended itself and left unapplied, member "<last>:<first>" of
  padded ids (pad_id), so members sort as the ids do.
]]
-- a stream id padded to "<15 digits>-<10 digits>": strings compare as the ids do
local function pad_id(id)
  local ms, seq = string.match(id, "^(%d+)-(%d+)$")
  return string.rep("0", 15 - #ms) .. ms .. "-" .. string.rep("0", 10 - #seq) .. seq
end

-- A transient topic's rebuild (rebuild.lua) replays the log into a lost SOW up to the
-- horizon it stored in the state hash ("rebuild_to": the log's last entry when the rebuild
-- began). Until the cursor passes it, the changes of the entries at or before it take their
-- seqs but make no change event (include remove_record emit): the subscribers delivered them
-- before the SOW was lost; they see a gap in the seqs and re-read the records. horizon: the
-- state's "rebuild_to" (nil: none), cursor: the partition's applied cursor.
local function quiet_rebuild(S, horizon, cursor)
  if not horizon then return end
  local h = pad_id(horizon)
  if pad_id(cursor) >= h then return end
  S.quiet = function(id) return pad_id(id) <= h end
end

-- record entries first .. last (stream ids) as appended by a trusted caller; before: the id
-- of the log entry just before first ("" none). The latest range grows when it ends there
-- (no other client's entry in between), so a worker's batch mostly lies in one range.
local function add_trusted(key, before, first, last)
  local from = pad_id(first)
  if before ~= "" then
    local top = redis.call("ZREVRANGEBYLEX", key, "+", "-", "LIMIT", 0, 1)[1]
    if top then
      local top_last, top_first = string.match(top, "^([^:]+):(.+)$")
      if top_last == pad_id(before) then
        redis.call("ZREM", key, top)
        from = top_first
      end
    end
  end
  redis.call("ZADD", key, 0, pad_id(last) .. ":" .. from)
end

-- the trusted ranges with entries after the cursor, {first, last} padded, in order (at most
-- 256; entries beyond them are verified by the worker)
local function trusted_after(key, cursor)
  local out = {}
  local members = redis.call("ZRANGEBYLEX", key, "[" .. pad_id(cursor) .. ";", "+",
    "LIMIT", 0, 256)
  for i = 1, #members do
    local last, first = string.match(members[i], "^([^:]+):(.+)$")
    out[i] = {first, last}
  end
  return out
end

-- drop the trusted ranges the cursor has passed
local function trim_trusted(key, cursor)
  redis.call("ZREMRANGEBYLEX", key, "-", "(" .. pad_id(cursor) .. ";")
end
local function apply_prepared(P, S, entries, ttl, nidx, accept)
  local ttl_ms = tonumber(ttl)
  local applied, cursor = 0, nil
  for _, entry in ipairs(entries) do
    local id, f = entry[1], entry[2]
    if accept and not accept(id) then
      return applied, cursor, true
    end
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
