--[[
  include remove_record: the batch state, record removal and the change feed, shared by
  apply.lua, expire.lua and delete_now.lua (included textually by the loader, after includes
  partition and event). Every function takes the partition context P and the batch state S as parameters.

  The partition context P comes from include partition (partition_context).

  batch_state(P, seq, expiring, dead_letter, keep_count, keep_ms) starts a batch: S.seq (the
  partition's change sequence, moved by every change), S.first (the seq of the batch's first
  change), S.changes (the fields of the batch's changes, in order; include event), S.expiring (the topic's
  expiration is enabled), S.dead_letter (the topic has a dead_letter topic), S.has_expiry
  (the expiry set is not empty), S.keep_count / S.keep_ms (change feed retention: changes per
  partition, and milliseconds; keep_count 0 = no feed), S.previous (upserts record the
  previous state in their change: P.previous), S.deferred (see write_deferred),
  S.now (set by the caller: the block time in ms; nil: publish_changes reads TIME),
  S.quiet (nil, or a function of a stream id: true for an entry a rebuild replays without a
  change event; include apply_prepared quiet_rebuild).
]]
-- The acks hash P.acks: per sow_delete entry by filter or SOW keys (its stream id), the
-- records it removed (HINCRBY as each goes), read by the client that appended it
-- (sow_redis.publish.wait.delete_counts) once it is applied. ack_entry records an entry that
-- removed nothing as 0 and keeps the hash an hour after the last delete. Under deletes that
-- never pause for an hour that expiry never comes: each time the hash reaches a multiple of
-- ACKS_CHECK fields, the fields of entries older than ACKS_KEEP_MS go (and any field that
-- is no stream id: nothing else writes there), one HKEYS per ACKS_CHECK deletes.
local ACKS_KEEP_MS = 3600000
local ACKS_CHECK = 1000

local function ack_entry(P, id)
  redis.call("HSETNX", P.acks, id, 0)
  if redis.call("HLEN", P.acks) % ACKS_CHECK == 0 then
    local t = redis.call("TIME")
    local cutoff = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - ACKS_KEEP_MS
    local old = {}
    for _, field in ipairs(redis.call("HKEYS", P.acks)) do
      local ms = tonumber(string.match(field, "^(%d+)%-%d+$"))
      if not ms or ms < cutoff then old[#old + 1] = field end
    end
    for i = 1, #old, 1000 do
      redis.call("HDEL", P.acks, unpack(old, i, math.min(i + 999, #old)))
    end
  end
  redis.call("PEXPIRE", P.acks, ACKS_KEEP_MS)
end

local function batch_state(P, seq, expiring, dead_letter, keep_count, keep_ms)
  return {seq = seq, first = seq + 1, changes = {}, inserts = 0, deletes = 0, expiries = 0,
          expiring = expiring,
          dead_letter = dead_letter, keep_count = tonumber(keep_count) or 0,
          keep_ms = tonumber(keep_ms) or 0, previous = P.previous,
          has_expiry = redis.call("EXISTS", P.exp) == 1, deferred = nil}
end

-- Count the batch's changes in the partition's state hash (fields n_insert, n_update,
-- n_delete, n_expire: the per-topic SOW statistics of `sow-redis stats`).
local function count_changes(P, S)
  local total = S.seq - S.first + 1
  local updates = total - S.inserts - S.deletes - S.expiries
  if S.inserts > 0 then redis.call("HINCRBY", P.state, "n_insert", S.inserts) end
  if updates > 0 then redis.call("HINCRBY", P.state, "n_update", updates) end
  if S.deletes > 0 then redis.call("HINCRBY", P.state, "n_delete", S.deletes) end
  if S.expiries > 0 then redis.call("HINCRBY", P.state, "n_expire", S.expiries) end
  S.inserts, S.deletes, S.expiries = 0, 0, 0
end

-- Record one change: the next seq, and its fields in the batch's block (previous: see
-- include event; nil for "").
local function emit(S, op, key, id, expiry_ms, data, reason, previous)
  S.seq = S.seq + 1
  if S.quiet and #S.changes == 0 and S.quiet(id) then
    -- a rebuild replays an entry the partition had applied before its SOW was lost: the
    -- change takes its seq, without an event (subscribers see a gap: include quiet_rebuild)
    S.first = S.seq + 1
    return
  end
  add_change(S.changes, op, key, S.seq, id, expiry_ms, data, reason, previous)
end

-- The change feed's time index is trimmed (by age, and after the feed's count trim) when a
-- block crosses a multiple of this many changes of the partition: amortised over small blocks
-- (a write-through applies one publish per block), at every block of a worker's large batches.
local FEED_UPKEEP_EVERY = 64

-- Publish the batch's change block on the partition's sharded channel (SPUBLISH: it stays on
-- the partition's node of a cluster), whether or not anyone listens,
-- and append it to the partition's change feed (stream id "<first seq>-0", so a reader finds
-- the block holding any seq), trimmed to the retention by count (every block) and by age
-- (see FEED_UPKEEP_EVERY). The block's time is S.now (ms) when the caller set it (the
-- expirer's TIME, read already), else the server's TIME.
local function publish_changes(P, S)
  if #S.changes == 0 then return end
  count_changes(P, S)
  local now = S.now
  if not now then
    now = now_ms()
  end
  local block = encode_block(P.topic, P.partition, S.first, S.seq, now, S.changes)
  redis.call("SPUBLISH", P.chan, block)
  if S.keep_count > 0 then
    local id = string.format("%d", S.first) .. "-0"
    local min_seq = S.seq - S.keep_count + 1
    local keep_id, keep_seq = feed_keep_from(P.changes, S.first, min_seq)
    local added
    if keep_id then
      added = redis.pcall("XADD", P.changes, "MINID", "~", keep_id, id, "block", block)
    else
      added = redis.pcall("XADD", P.changes, id, "block", block)
    end
    if type(added) == "table" and added.err then
      -- the feed holds ids at or above this block's first seq (the partition's sequence was
      -- reset under an old feed): start the feed anew; readers of the old one see a gap and
      -- recover by re-reading the records
      redis.call("DEL", P.changes, P.change_times)
      redis.call("XADD", P.changes, id, "block", block)
    end
    redis.call("ZADD", P.change_times, now, string.format("%d", S.first))
    if math.floor(S.seq / FEED_UPKEEP_EVERY) ~= math.floor((S.first - 1) / FEED_UPKEEP_EVERY) then
      if S.keep_ms > 0 then
        local cutoff = now - S.keep_ms
        local oldest = redis.call("ZRANGE", P.change_times, 0, 0, "WITHSCORES")
        if oldest[2] and tonumber(oldest[2]) < cutoff then
          local keep = redis.call("ZRANGEBYSCORE", P.change_times, cutoff, "+inf", "LIMIT", 0, 1)
          if keep[1] then
            redis.call("XTRIM", P.changes, "MINID", keep[1] .. "-0")
            redis.call("ZREMRANGEBYSCORE", P.change_times, "-inf", "(" .. cutoff)
          end
        end
      end
      -- the time index follows the count trim: its oldest entries (lowest times, lowest
      -- seqs) whose block lies below the feed's first kept seq
      local o = redis.call("ZRANGE", P.change_times, 0, 4 * FEED_UPKEEP_EVERY - 1)
      local n = 0
      while o[n + 1] and tonumber(o[n + 1]) < (keep_seq or min_seq) do n = n + 1 end
      if n > 0 then redis.call("ZREMRANGEBYRANK", P.change_times, 0, n - 1) end
    end
  end
  S.changes = {}
  S.first = S.seq + 1
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

-- Remove a stored record with its expiry score and index members, emit a sow_delete change
-- with the reason ("deleted" or "expired"), and (reason "expired", dead_letter on) queue a
-- dead-letter copy. cause_id: the log entry that removed it (a sow_delete); nil for an
-- expiry, whose event carries the id of the entry that last wrote the record.
local function remove_record(P, S, key, stored, reason, cause_id)
  redis.call("HDEL", P.rec, key)
  redis.call("ZREM", P.exp, key)
  if #P.idx > 0 then
    local om = redis.call("HGET", P.ixm, key)
    local olds = {}
    if om then olds = split_members(om) end
    for j = 1, #P.idx do
      local o = olds[j]
      if P.num[j] and (not om or o == "#") then
        -- a number (or, with no entry kept, perhaps one): the key is its member
        redis.call("ZREM", P.num[j], key)
      elseif o and o ~= "" then
        redis.call("ZREM", P.idx[j], o)
      end
    end
    if om then redis.call("HDEL", P.ixm, key) end
  end
  local body = string.sub(stored, string.find(stored, "\n", 1, true) + 1)
  local exp_ms = header_field(stored, 2)
  emit(S, "sow_delete", key, cause_id or header_field(stored, 3), exp_ms, body, reason)
  if reason == "expired" then S.expiries = S.expiries + 1 else S.deletes = S.deletes + 1 end
  if S.dead_letter and reason == "expired" then
    redis.call("XADD", P.dead, "*", "sow_key", key, "topic", P.topic, "expiry_ms", exp_ms,
      "data", body)
  end
end
