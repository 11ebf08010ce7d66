--[[
  apply: apply one batch of a partition's transaction log to the SOW, atomically.

  Checks the fencing token and that the batch is newer than the applied cursor, checks the
  expected record versions (compare-and-set for delta merges done by the worker), then
  upserts / deletes records, keeps expiry scores and hash-index members, moves the cursor,
  counts sow_delete results and publishes one change event per change (skipped when the
  channel has no subscriber and no pattern subscription exists: nobody could receive it).

  Input:
    KEYS[1] records   HASH  sow_key -> "<seq>:<expiry ms>:<stream id>\n<data>"
    KEYS[2] state     HASH  cursor, seq, fence
    KEYS[3] expiry    ZSET  sow_key -> expiry ms
    KEYS[4] acks      HASH  stream id -> records removed by that sow_delete
    KEYS[5] ixm       HASH  sow_key -> comma-separated hash-index members
    KEYS[6] dead      STREAM dead-letter outbox (expired records for the dead_letter topic)
    KEYS[7] chain     HASH  chain identifier -> chain head (chaining key generator, seeds/003)
    KEYS[8..7+n]      ZSET  hash index i (members "<value hash>:<sow_key>", score 0)
    ARGV[1] fencing token          ARGV[2] pub/sub channel     ARGV[3] topic name
    ARGV[4] first stream id of the batch   ARGV[5] last stream id of the batch
    ARGV[6] n (number of hash indexes)     ARGV[7] "1" when the topic has a dead_letter topic
    ARGV[8..] ops, 5 fields each: op, stream id, sow_key, data, meta
              op: "publish" | "delta_publish" (upsert), "sow_delete" (delete), "ack",
                  "chain" (sow_key field = chain identifier, data = its chain head)
              meta: "" (no expiry, unchecked, no index members) or
                    "<expiry>|<expected seq>|<index members>" where expiry is absolute ms,
                    "" (none) or "now" (TTL 0: deliver to current subscribers, then expire),
                    expected seq is "-" (unchecked) or the seq the record must have ("0" =
                    absent), index members as in KEYS[5]

  Output:
    {applied ops, new cursor} or {-1, cursor} when the batch was applied before.
    Error replies: "SOW_FENCED …" (stale fencing token), "SOW_CONFLICT <sow_key>" (a record
    changed since the worker read it; nothing was written), "SOW_BADARGS …" (malformed call).
]]
local rec, state, exp, acks, ixm = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local fence, chan, topic = ARGV[1], ARGV[2], ARGV[3]
local first_id, last_id, nidx = ARGV[4], ARGV[5], tonumber(ARGV[6])
local dead_letter = ARGV[7] == "1"
local FIRST, WIDTH = 8, 5

local listeners = redis.call("PUBSUB", "NUMSUB", chan)[2] > 0 or
  redis.call("PUBSUB", "NUMPAT") > 0

--@include remove_record

if (#ARGV - FIRST + 1) % WIDTH ~= 0 then
  return redis.error_reply("SOW_BADARGS ops must have " .. WIDTH .. " fields each")
end

local function id_less_eq(a, b)
  local ams, aseq = string.match(a, "^(%d+)-(%d+)$")
  local bms, bseq = string.match(b, "^(%d+)-(%d+)$")
  ams, aseq, bms, bseq = tonumber(ams), tonumber(aseq), tonumber(bms), tonumber(bseq)
  return ams < bms or (ams == bms and aseq <= bseq)
end

local function parse_meta(meta)
  if meta == "" then return "", "-", "" end
  return string.match(meta, "^([^|]*)|([^|]*)|(.*)$")
end

local meta = redis.call("HMGET", state, "fence", "cursor", "seq")
if meta[1] ~= fence then
  return redis.error_reply("SOW_FENCED token " .. fence .. " is stale")
end
local cursor = meta[2] or "0-0"
if id_less_eq(first_id, cursor) then
  return {-1, cursor}
end
local seq = tonumber(meta[3] or "0")

-- validation pass: nothing is written unless every expected version holds
for i = FIRST, #ARGV, WIDTH do
  if ARGV[i + 4] ~= "" then
    local _, expect = parse_meta(ARGV[i + 4])
    if expect ~= "-" then
      local cur = redis.call("HGET", rec, ARGV[i + 2])
      local cur_seq = "0"
      if cur then cur_seq = string.match(cur, "^(%d+):") end
      if cur_seq ~= expect then
        return redis.error_reply("SOW_CONFLICT " .. ARGV[i + 2])
      end
    end
  end
end

local has_expiry = redis.call("EXISTS", exp) == 1

local applied = 0
for i = FIRST, #ARGV, WIDTH do
  local op, id, key, data = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local ex, _, members = parse_meta(ARGV[i + 4])
  if op == "chain" then
    redis.call("HSET", KEYS[7], key, data)
  elseif op == "ack" then
    redis.call("HSETNX", acks, id, 0)
    redis.call("PEXPIRE", acks, 3600000)
  elseif op == "sow_delete" then
    local old = redis.call("HGET", rec, key)
    if old then
      seq = seq + 1
      remove_record(key, old, seq, "sow_delete", false)
      redis.call("HINCRBY", acks, id, 1)
      applied = applied + 1
    end
  elseif op == "publish" or op == "delta_publish" then
    seq = seq + 1
    local exp_ms = ex
    if ex == "" then exp_ms = "0" elseif ex == "now" then exp_ms = string.match(id, "^(%d+)") end
    local stored = seq .. ":" .. exp_ms .. ":" .. id .. "\n" .. data
    redis.call("HSET", rec, key, stored)
    if ex ~= "" then
      redis.call("ZADD", exp, exp_ms, key)
      has_expiry = true
    elseif has_expiry then
      redis.call("ZREM", exp, key)
    end
    if nidx > 0 then
      local om = redis.call("HGET", ixm, key)
      if om ~= members then
        local news = split_members(members)
        local olds = {}
        if om then olds = split_members(om) end
        for j = 1, nidx do
          if olds[j] ~= news[j] then
            if olds[j] and olds[j] ~= "" then redis.call("ZREM", KEYS[7 + j], olds[j]) end
            if news[j] and news[j] ~= "" then redis.call("ZADD", KEYS[7 + j], 0, news[j]) end
          end
        end
        redis.call("HSET", ixm, key, members)
      end
    end
    if listeners then
      redis.call("PUBLISH", chan, '{"topic":"' .. topic .. '","op":"' .. op .. '","sow_key":"' ..
        key .. '","seq":' .. seq .. ',"id":"' .. id .. '","expiry_ms":' .. exp_ms ..
        ',"data":' .. data .. '}')
    end
    if ex == "now" then
      -- TTL 0 (expiration_policy "min"): delivered to current subscribers, never kept
      seq = seq + 1
      remove_record(key, stored, seq, "expired", dead_letter)
    end
    applied = applied + 1
  else
    return redis.error_reply("SOW_BADARGS unknown op " .. tostring(op))
  end
end

redis.call("HSET", state, "cursor", last_id, "seq", seq)
return {applied, last_id}
