--[[
  include apply_from_log: apply_from_log(P), the "log" operation of apply.lua: apply the plain
  publishes at the head of a partition's unapplied log, reading the log in the script itself (no round trip of the messages back from the worker), atomically.

  A log entry written by sow_redis's publisher carries the SOW key it computed (field "k") and,
  on a topic with hash indexes, the record's index members (field "m"); see
  sow_redis/model/entries.py. Such fields are never trusted as read from the log. The script applies
  a prepared publish only when
    * it lies inside a trusted range: entries that a caller with the right to run scripts
      appended itself (apply.lua (appended)) and left unapplied; or
    * the worker read it, checked that "k" and "m" are what the topic's definition gives for
      its data and partition (sow_redis/apply/keying.py verified_prepared), and names the last
      entry it verified (ARGV[OP + 3]; log entries are append-only: an id names one entry for
      good).
  It reads at most `count` entries after the applied cursor and upserts them exactly as
  apply.lua does (include apply_prepared, write_record: same records, expiry scores, index
  members, change events), in log order, stopping before the first entry that is anything
  else, which the worker then reads, verifies or plans, and applies (rejecting a forged "k"
  or "m" to the error stream). Trusted ranges the cursor has passed are dropped.

  Input (after the partition's KEYS and ARGV head, include partition):
    ARGV[OP + 1] fencing token   ARGV[OP + 2] count (entries read at most)
    ARGV[OP + 3] the stream id of the last entry the worker verified ("0-0": none; only the
             trusted ranges)

  Output:
    {entries applied, cursor, more}: more = 0 the log is drained, 1 `count` entries were
    applied (there may be more), 2 stopped before an entry the worker must plan.
    Error reply: "SOW_FENCED …" (stale fencing token).
]]
local function apply_from_log(P)
  local fence, count = ARGV[OP + 1], tonumber(ARGV[OP + 2])
  local meta = redis.call("HMGET", P.state, "fence", "cursor", "seq", "rebuild_to")
  if meta[1] ~= fence then
    return redis.error_reply("SOW_FENCED token " .. fence .. " is stale")
  end
  local cursor = meta[2] or "0-0"
  local entries = redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", count)
  local S = batch_state(P, tonumber(meta[3] or "0"), P.expiring, P.dead_letter, P.keep_count,
                            P.keep_ms)
  quiet_rebuild(S, meta[4], cursor)
  -- no entry here reads a record (no expiry check without expiration): write them in bulk
  if not P.expiring then S.deferred = new_deferred() end

  local trusted_key = P.trusted
  local verified = pad_id(ARGV[OP + 3])
  local ranges, ri = trusted_after(trusted_key, cursor), 1
  local function accept(id)
    local pid = pad_id(id)
    if pid <= verified then return true end
    while ri <= #ranges and ranges[ri][2] < pid do ri = ri + 1 end
    return ri <= #ranges and ranges[ri][1] <= pid
  end

  -- most batches lie in one trusted range (or were all verified): no check per entry then
  local check = accept
  if #entries > 0 then
    local first, final = pad_id(entries[1][1]), pad_id(entries[#entries][1])
    if final <= verified or (#ranges > 0 and ranges[1][1] <= first and final <= ranges[1][2]) then
      check = nil
    end
  end
  local applied, last, stopped = apply_prepared(P, S, entries, P.ttl, P.nidx, check)
  local more = 0
  if stopped then more = 2 elseif #entries == count then more = 1 end
  if applied > 0 then
    cursor = last
    finish_prepared(P, S, cursor)
    trim_trusted(trusted_key, cursor)
  end
  return {applied, cursor, more}
end
