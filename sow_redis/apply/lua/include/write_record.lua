--[[
  include write_record: the upsert of one record, shared by apply.lua (ops planned by the
  worker), apply.lua (log) (plain publishes read from the log by the script itself),
  apply.lua (appended) and apply.lua (load), so all
  write records, expiry scores, index members (hash and range) and change events the same way. Included
  after include event and include remove_record (batch state S: see there).
]]
-- arguments of one bulk HSET / HMGET / ZREM (well below Lua's stack limit)
local DEFERRED_MAX = 1000

-- Deferred writes (bulk mode): a caller whose batch reads no record it writes (apply.lua (log),
-- apply.lua (appended), apply.lua (load): prepared publishes only, on a topic without expiration)
-- sets S.deferred = new_deferred(). upsert then keeps, per SOW key, only the batch's last write
-- (its seq, expiry, stream id, data and index members) and write_deferred, which the caller
-- must call before it returns, writes each key once: one HSET of the records, one HMGET of
-- the old index members and the index changes from those to the last ones. The change events
-- are emitted per message all the same. The result equals upserting message by message: a
-- record is its last write; an index member names its key (a number's member is the key),
-- one per key and index, so only a key's first and last members matter; the insert count is
-- the HSET's new fields.
local function new_deferred()
  return {keys = {}, seq = {}, exp = {}, id = {}, data = {}, members = {}}
end

-- run cmd on key followed by args[1..n], at most DEFERRED_MAX arguments a call; the replies
-- summed (numbers) or concatenated (arrays): a single call's array reply as it is, not copied
local function chunked(cmd, key, args, n)
  if n > 0 and n <= DEFERRED_MAX then
    local rep = redis.call(cmd, key, unpack(args, 1, n))
    if type(rep) == "table" then return 0, rep end
    return rep, {}
  end
  local total, out = 0, {}
  for i = 1, n, DEFERRED_MAX do
    local last = math.min(i + DEFERRED_MAX - 1, n)
    local rep = redis.call(cmd, key, unpack(args, i, last))
    if type(rep) == "table" then
      for j = 1, #rep do out[#out + 1] = rep[j] end
    else
      total = total + rep
    end
  end
  return total, out
end

-- Index members. A record's members come positional and comma-separated: per hash index
-- "<value hash>:<SOW key>"; per range index "#<score>" for a number, kept in P.num[j] with
-- the SOW key as member, or a lex member "<tag><hex>/<SOW key>" in P.idx[j]; "" for none.
-- The hash of index members P.ixm keeps a key's members with each number as "#" alone, and
-- no entry for a key whose members are all numbers or empty
-- (sow_redis.model.rangeindex.stored_members): a key without an entry may hold a number in
-- any range index, which a write of anything else there removes blindly (ZREM of the key).

-- The moves of a batch, empty: per index j the lex members to remove (rems[j]) and the
-- score-and-member pairs to add (adds[j]); per range index the SOW keys to remove from its
-- numbers (nrems[j]) and the score-and-key pairs to add (nadds[j], nn[j] entries: counted,
-- not measured with #, a binary search in Lua 5.1, per message). No member is both removed
-- and added: every member names its key, and a key's moves are collected once. n: the
-- number of indexes.
local function new_moves(P)
  local n = #P.idx
  local m = {n = n, rems = {}, adds = {}, nrems = {}, nadds = {}, nn = {}}
  for j = 1, n do m.rems[j], m.adds[j], m.nrems[j], m.nadds[j], m.nn[j] = {}, {}, {}, {}, 0 end
  return m
end

-- A score as ZADD takes it: a number, not NaN, no blank (Lua's tonumber skips blanks, ZADD
-- refuses them; an error there would fail the whole script, its writes so far made).
local function valid_score(text)
  local x = tonumber(text)
  return x ~= nil and x == x and not string.find(text, "%s")
end

local HASH_SIGN = 35  -- "#"

local byte, find, sub = string.byte, string.find, string.sub

-- collect_numbers on a topic with one index, a range index (m.n == 1 and P.num[1]).
local function collect_number(key, members, m)
  if byte(members, 1) ~= HASH_SIGN or find(members, ",", 2, true) then return false end
  local a, c = m.nadds[1], m.nn[1]
  a[c + 1], a[c + 2] = sub(members, 2), key
  m.nn[1] = c + 2
  return true
end

-- The common case of collect_moves, in one pass: key has no P.ixm entry (old is nil) and
-- each of its members is a number, "#<score>", in a range index (as on a topic whose range
-- indexes hold numbers: a ZADD each, which replaces the key's old score; nothing to remove,
-- no entry to keep). The score texts are not checked here but by the ZADD (add_numbers).
-- Returns false, having collected nothing, when that is not so (a hash index, a text):
-- collect_moves then does it all. One range index, the most common, takes no table.
local function collect_numbers(P, key, members, m)
  local n, num = m.n, P.num
  if n == 1 and num[1] then return collect_number(key, members, m) end
  if string.byte(members, 1) ~= HASH_SIGN then return false end
  local scores, start = {}, 1
  for j = 1, n do
    if not num[j] or string.byte(members, start) ~= HASH_SIGN then return false end
    local stop = string.find(members, ",", start, true)
    if (stop == nil) ~= (j == n) then return false end  -- not one member per index
    scores[j] = string.sub(members, start + 1, (stop or 0) - 1)
    if stop then start = stop + 1 end
  end
  local nadds, nn = m.nadds, m.nn
  for j = 1, n do
    local a, c = nadds[j], nn[j]
    a[c + 1], a[c + 2] = scores[j], key
    nn[j] = c + 2
  end
  return true
end

-- Collect into m the moves of key's index members from old (its P.ixm entry, nil: none) to
-- members; returns the entry to keep (nil: none).
local function collect_moves(P, key, old, members, m)
  if not old and collect_numbers(P, key, members, m) then return nil end
  local news = split_members(members)
  local olds = {}
  if old then olds = split_members(old) end
  local kept, keep = {}, false
  for j = 1, #P.idx do
    local new, o = news[j] or "", olds[j]
    local num = P.num[j]
    local lex_new = new
    if num and string.byte(new, 1) == HASH_SIGN then
      lex_new = ""
      local score = string.sub(new, 2)
      if valid_score(score) then
        local a, c = m.nadds[j], m.nn[j]
        a[c + 1], a[c + 2] = score, key
        m.nn[j] = c + 2
        kept[j] = "#"
      else
        kept[j] = ""
      end
    else
      kept[j] = new
      if new ~= "" then keep = true end
    end
    if num and kept[j] ~= "#" and (not old or o == "#") then
      local r = m.nrems[j]
      r[#r + 1] = key
    end
    local lex_old = o
    if lex_old == "#" then lex_old = nil end
    if lex_old ~= lex_new then
      if lex_old and lex_old ~= "" then m.rems[j][#m.rems[j] + 1] = lex_old end
      if lex_new ~= "" then
        local a = m.adds[j]
        a[#a + 1] = 0
        a[#a + 1] = lex_new
      end
    end
  end
  if keep then return table.concat(kept, ",") end
  return nil
end

-- ZADD the score-and-key pairs a[1..n] to the numbers of a range index (key), at most
-- DEFERRED_MAX arguments a call. ZADD parses every score of a call before it adds any, so a
-- call refused for a score (not a number, NaN: never one of sow_redis's publisher, whose
-- members the worker checks, but the scores of collect_numbers are not checked before)
-- added nothing; it is then done again with each score checked (valid_score), as
-- collect_moves does: a key whose score is none holds no number there (ZREM).
local function add_numbers(key, a, n)
  for i = 1, n, DEFERRED_MAX do
    local last = math.min(i + DEFERRED_MAX - 1, n)
    local rep = redis.pcall("ZADD", key, unpack(a, i, last))
    if type(rep) == "table" and rep.err then
      local ok, bad = {}, {}
      for k = i, last, 2 do
        if valid_score(a[k]) then
          ok[#ok + 1] = a[k]
          ok[#ok + 1] = a[k + 1]
        else
          bad[#bad + 1] = a[k + 1]
        end
      end
      if #ok > 0 then redis.call("ZADD", key, unpack(ok)) end
      if #bad > 0 then redis.call("ZREM", key, unpack(bad)) end
    end
  end
end

local function write_moves(P, m)
  for j = 1, m.n do
    if #m.rems[j] > 0 then chunked("ZREM", P.idx[j], m.rems[j], #m.rems[j]) end
    if #m.adds[j] > 0 then chunked("ZADD", P.idx[j], m.adds[j], #m.adds[j]) end
    if #m.nrems[j] > 0 then chunked("ZREM", P.num[j], m.nrems[j], #m.nrems[j]) end
    if m.nn[j] > 0 then add_numbers(P.num[j], m.nadds[j], m.nn[j]) end
  end
end

-- Move one key's index members to members (see collect_moves), its P.ixm entry with them.
local function move_members(P, key, members)
  local old = redis.call("HGET", P.ixm, key) or nil
  local m = new_moves(P)
  local kept = collect_moves(P, key, old, members, m)
  write_moves(P, m)
  if kept ~= old then
    if kept then redis.call("HSET", P.ixm, key, kept) else redis.call("HDEL", P.ixm, key) end
  end
end

-- The previous state of a change from the stored record old ("<header>\n<JSON>"): the stored
-- text as it is, header and all, which the change block's reader strips (the previous field
-- starts with a digit then: sow_redis.model.events): a copy of the record into a new Lua
-- string fewer per change. The JSON alone for a topic that keeps history (reverse_delta
-- compares it with the new record).
local function stored_previous(P, old)
  if not P.reverse then return old end
  return string.sub(old, string.find(old, "\n", 1, true) + 1)
end

-- change_previous in bulk mode: a change whose key the batch had not written before records
-- its previous state after the batch's loop, from the stored records, which bulk mode leaves
-- as they were until write_deferred: one HMGET per DEFERRED_MAX such changes instead of one
-- HGET per message. S.pending holds their field indexes in S.changes (the previous field, a
-- placeholder until then), S.pending_keys the SOW key of each, S.npending how many (kept, not
-- counted with #: a length is a binary search in Lua 5.1, and these are per message).
local function resolve_previous(P, S)
  local pend, n = S.pending, S.npending
  if not pend or n == 0 then return end
  local _, stored = chunked("HMGET", P.rec, S.pending_keys, n)
  local changes, reverse = S.changes, P.reverse
  for i = 1, n do
    local old, at = stored[i], pend[i]
    if reverse then
      local previous = "null"
      if old then previous = stored_previous(P, old) end
      changes[at] = reverse_delta(previous, changes[at - 1])
    else
      changes[at] = old or "null"  -- the stored text as it is (stored_previous)
    end
  end
  S.pending, S.pending_keys, S.npending = nil, nil, 0
end

-- The index moves of write_deferred: keys ks[1..nk] to their last members (SOW key → members),
-- each key once, with the hash of index members.
local function write_deferred_members(P, ks, nk, members)
  local old = {}  -- no entry at all (a topic whose members are numbers): no HMGET
  if redis.call("EXISTS", P.ixm) == 1 then old = select(2, chunked("HMGET", P.ixm, ks, nk)) end
  local changed, nc, dropped = {}, 0, {}
  local m = new_moves(P)  -- each key is written once here: its moves once
  local one = m.n == 1 and P.num[1]  -- one range index: collect_number first, no more calls
  for i = 1, nk do
    local k = ks[i]
    local om, mem = old[i] or nil, members[k]
    if not (one and not om and collect_number(k, mem, m)) then
      local kept = collect_moves(P, k, om, mem, m)
      if kept ~= om then
        if kept then
          changed[nc + 1] = k
          changed[nc + 2] = kept
          nc = nc + 2
        else
          dropped[#dropped + 1] = k
        end
      end
    end
  end
  write_moves(P, m)
  if nc > 0 then chunked("HSET", P.ixm, changed, nc) end
  if #dropped > 0 then chunked("HDEL", P.ixm, dropped, #dropped) end
end

-- Write the deferred last writes of the batch (see new_deferred): records, expiry scores, index
-- members. Leaves S.deferred empty for the next part of the batch.
local function write_deferred(P, S)
  resolve_previous(P, S)  -- first: the stored records are still those the batch replaces
  local d = S.deferred
  if not d or #d.keys == 0 then return end
  local ks, nk = d.keys, #d.keys
  local args = {}
  for i = 1, nk do
    local k = ks[i]
    args[2 * i - 1] = k
    args[2 * i] = d.seq[k] .. ":" .. d.exp[k] .. ":" .. d.id[k] .. "\n" .. d.data[k]
  end
  -- the reply counts the fields that were new: the inserts among these upserts (a key
  -- written twice in the batch counts once as an insert, once as an update)
  S.inserts = S.inserts + chunked("HSET", P.rec, args, 2 * nk)
  if S.has_expiry then chunked("ZREM", P.exp, ks, nk) end
  if #P.idx > 0 then write_deferred_members(P, ks, nk, d.members) end
  S.deferred = new_deferred()
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
    if is_due(exp_ms, id_ms(id)) then
      remove_record(P, S, key, old, "expired", nil)
      return nil
    end
  end
  return old
end

-- The JSON text of key's record before this write, for the change event of a topic with
-- change_previous: the batch's own last write of key (bulk mode), else the stored record
-- (old, read by live_record on an expiring topic, where nil means none), "null" when there is
-- none. Bulk mode reads the stored ones afterwards for the whole batch (resolve_previous).
local function previous_data(P, S, d, key, old)
  if d and d.seq[key] then return d.data[key] end
  if not S.expiring then
    old = redis.call("HGET", P.rec, key)
  end
  if not old then return "null" end
  return stored_previous(P, old)
end

-- Store data as the record of key, written by the log entry id with op "publish" or
-- "delta_publish" (data already merged). ex: "" (no expiry), "now" (TTL 0: delivered to
-- current subscribers, then removed as expired) or absolute expiry ms as text. members:
-- the positional, comma-separated hash-index members.
local function upsert(P, S, op, id, key, data, ex, members)
  local old
  if S.expiring then old = live_record(P, S, key, id) end
  local exp_ms = ex
  if ex == "" then exp_ms = "0" elseif ex == "now" then exp_ms = string.match(id, "^(%d+)") end
  local d = S.deferred
  local previous, pending = nil, false
  if S.previous then
    if d and not d.seq[key] then
      pending = true  -- the stored record, read for the whole batch by resolve_previous
    else
      previous = previous_data(P, S, d, key, old)
      if P.reverse then previous = reverse_delta(previous, data) end
    end
  end
  if pending then
    local changes = S.changes
    local before = #changes
    emit(S, op, key, id, exp_ms, data, nil, previous)
    local at = before + EVENT_WIDTH  -- the previous field of the change emit added
    if changes[at] then  -- not a change a rebuild replays quietly
      if not S.pending then S.pending, S.pending_keys, S.npending = {}, {}, 0 end
      local np = S.npending + 1
      S.pending[np], S.pending_keys[np], S.npending = at, key, np
    end
  else
    emit(S, op, key, id, exp_ms, data, nil, previous)
  end
  if d and ex ~= "" then
    -- an expiry in bulk mode (not on a topic without expiration): write the batch so far,
    -- then this message by itself
    write_deferred(P, S)
  elseif d then
    if not d.seq[key] then d.keys[#d.keys + 1] = key end
    d.seq[key], d.exp[key], d.id[key], d.data[key] = S.seq, exp_ms, id, data
    d.members[key] = members
    return
  end
  local stored = S.seq .. ":" .. exp_ms .. ":" .. id .. "\n" .. data
  S.inserts = S.inserts + redis.call("HSET", P.rec, key, stored)
  if ex ~= "" then
    redis.call("ZADD", P.exp, exp_ms, key)
    S.has_expiry = true
  elseif S.has_expiry then
    redis.call("ZREM", P.exp, key)
  end
  if #P.idx > 0 then move_members(P, key, members) end
  if ex == "now" then
    -- TTL 0 (expiration_policy "min"): delivered to current subscribers, never kept
    remove_record(P, S, key, stored, "expired", nil)
  end
end
