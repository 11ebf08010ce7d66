--[[
  include apply_planned: apply_planned(P), the "planned" operation of apply.lua: apply one
  batch of a partition's transaction log, as a worker planned it, to the SOW, atomically.

  Checks the fencing token and that the batch is newer than the applied cursor (a batch the
  cursor lies inside was partly applied by someone else: SOW_CONFLICT, plan again), checks the
  expected record versions (compare-and-set for delta merges done by the worker), writes the
  batch's rejected entries to the partition's error stream, then upserts / deletes records,
  keeps expiry scores and hash-index members, moves the cursor (dropping the trusted ranges it
  passed: include apply_prepared trim_trusted), counts sow_delete results and
  publishes the batch's changes as one change block on the partition's channel and in the
  partition's change feed (include remove_record publish_changes).

  Every entry sees the SOW as of its own log time (ARCHITECTURE §5; issue "deltas race
  expiry"): when the topic's expiration is enabled and the stored record of an op's SOW key
  was due at or before the op's stream id time, the record is first removed as an expiry
  (change reason "expired", dead-letter copy), then the op runs on an absent record.

  Input (after the partition's KEYS and ARGV head, include partition):
    ARGV[OP + 1] fencing token   ARGV[OP + 2] first stream id of the batch
    ARGV[OP + 3] last stream id of the batch   ARGV[OP + 4] e (number of rejected entries)
    ARGV[OP + 5] packing: "flat" (the fields below are ARGV[OP + 6 ..]) or "msgpack"
             (ARGV[OP + 6] is one MessagePack array of the fields below, unpacked with
             Redis's cmsgpack: one argument instead of 7 per op, measured cheaper for the
             worker; docs/benchmarks.md)
    then e × 6 fields:
              stream id, reason, detail, cmd, data, sow_key   (→ XADD errors, exactly once)
    then ops, 7 fields each (packed by sow_redis/apply/scripts.py _pack_op from sow_redis/apply/ops.py):
              op: "publish" | "delta_publish" (upsert), "sow_delete" (delete), "ack",
                  "chain" (sow_key field = chain identifier, data = its chain head)
              stream id, sow_key, data,
              expiry: "" (none), "now" (TTL 0: deliver to current subscribers, then expire)
                      or absolute ms,
              expected seq: "" (unchecked) or the seq the record must have ("0" = absent),
              index members: positional, comma-separated, as stored in ixm

  Output:
    {applied ops, new cursor} or {-1, cursor} when the batch was applied before.
    Error replies: "SOW_FENCED …" (stale fencing token), "SOW_CONFLICT <sow_key>" (a record
    changed since the worker read it; nothing was written), "SOW_CONFLICT cursor …" (the
    cursor lies inside the batch; nothing was written), "SOW_BADARGS …" (malformed call).
]]
local function id_parts(id)
  local ms, s = string.match(id, "^(%d+)-(%d+)$")
  return tonumber(ms), tonumber(s)
end

local function id_less_eq(a, b)
  local ams, aseq = id_parts(a)
  local bms, bseq = id_parts(b)
  return ams < bms or (ams == bms and aseq <= bseq)
end

local function apply_planned(P)
  local fence, first_id, last_id = ARGV[OP + 1], ARGV[OP + 2], ARGV[OP + 3]
  local nerr = tonumber(ARGV[OP + 4])
  local D, ERR_FIRST = ARGV, OP + 6
  if ARGV[OP + 5] == "msgpack" then D, ERR_FIRST = cmsgpack.unpack(ARGV[OP + 6]), 1 end
  local ERR_WIDTH, WIDTH = 6, 7
  local FIRST = ERR_FIRST + ERR_WIDTH * (nerr or 0)
  local ERRORS_MAXLEN = 100000

  if not nerr or (#D - FIRST + 1) % WIDTH ~= 0 then
    return redis.error_reply("SOW_BADARGS ops must have " .. WIDTH .. " fields each")
  end

  local meta = redis.call("HMGET", P.state, "fence", "cursor", "seq", "rebuild_to")
  if meta[1] ~= fence then
    return redis.error_reply("SOW_FENCED token " .. fence .. " is stale")
  end
  local cursor = meta[2] or "0-0"
  if id_less_eq(last_id, cursor) then
    return {-1, cursor}
  end
  if id_less_eq(first_id, cursor) then
    -- the head of the batch was applied meanwhile (the publisher's write-through,
    -- apply.lua (appended)): what the worker planned after it may rest on an older state
    return redis.error_reply("SOW_CONFLICT cursor " .. cursor .. " is inside the batch")
  end
  local seq = tonumber(meta[3] or "0")

  -- validation pass: nothing is written unless every expected version holds
  for i = FIRST, #D, WIDTH do
    local expect = D[i + 5]
    if expect ~= "" then
      local cur = redis.call("HGET", P.rec, D[i + 2])
      local cur_seq = "0"
      if cur then cur_seq = string.match(cur, "^(%d+):") end
      if cur_seq ~= expect then
        return redis.error_reply("SOW_CONFLICT " .. D[i + 2])
      end
    end
  end

  for i = ERR_FIRST, FIRST - 1, ERR_WIDTH do
    redis.call("XADD", P.errors, "MAXLEN", "~", ERRORS_MAXLEN, "*",
      "reason", D[i + 1], "detail", D[i + 2], "id", D[i], "partition", P.partition,
      "cmd", D[i + 3], "data", D[i + 4], "sow_key", D[i + 5])
  end

  local S = batch_state(P, seq, P.expiring, P.dead_letter, P.keep_count, P.keep_ms)
  quiet_rebuild(S, meta[4], cursor)
  local applied = 0
  for i = FIRST, #D, WIDTH do
    local op, id, key = D[i], D[i + 1], D[i + 2]
    if op == "chain" then
      redis.call("HSET", P.chain, key, D[i + 3])
    elseif op == "ack" then
      ack_entry(P, id)
    elseif op == "sow_delete" then
      local old = live_record(P, S, key, id)
      if old then
        remove_record(P, S, key, old, "deleted", id)
        redis.call("HINCRBY", P.acks, id, 1)
        applied = applied + 1
      end
    elseif op == "publish" or op == "delta_publish" then
      upsert(P, S, op, id, key, D[i + 3], D[i + 4], D[i + 6])
      applied = applied + 1
    else
      return redis.error_reply("SOW_BADARGS unknown op " .. tostring(op))
    end
  end

  redis.call("HSET", P.state, "cursor", last_id, "seq", S.seq)
  -- the trusted ranges the cursor passed (a delta a publisher appended, applied here): only
  -- apply.lua (log) dropped them before, and a run of deltas never reaches it
  trim_trusted(P.trusted, last_id)
  publish_changes(P, S)
  return {applied, last_id}
end
