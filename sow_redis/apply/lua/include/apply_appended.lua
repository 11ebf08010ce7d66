--[[
  include apply_appended: apply_appended(P), the "appended" operation of apply.lua: a
  publisher's append of one chunk to one partition, with its write-through.
  The script itself appends the chunk's entries to the partition's log (XADD, in order) and,
  with write-through asked and the log holding no unapplied entry before them, applies them
  there and then, exactly as a worker would (include apply_prepared: same records, expiry
  scores, index members, sequence, change feed and change block). A publish to a caught-up
  partition is thereby applied and delivered to subscribers in the publisher's own round
  trip, with no worker hop.

  Trust: the SOW key ("k") and index members ("m") applied here are those of the entries this
  very call appends, computed by the calling process (sow_redis's publisher, which needs the
  right to run scripts); an entry some other client appended is never applied here, because
  the call applies nothing when the log holds any unapplied entry before its own. The entries
  it leaves unapplied are recorded as a trusted range (include apply_prepared add_trusted), so
  the workers' apply.lua (log) applies their prepared publishes without reading them; every
  other entry of the log (a plain XADD of any client) is read and verified by a worker.

  Why it is safe without a fencing token: the script is atomic and starts at the applied
  cursor, so an entry is applied once whoever applies it (the cursor moves past it). A worker
  batch planned before this script moved the cursor is refused by apply.lua (SOW_CONFLICT
  when the cursor lies inside the batch, "applied before" when past it) and planned again.

  Definition fence (issue 23.4): the entries' SOW keys, partition and index members were
  computed under the caller's definition of the topic, whose fingerprint is ARGV[11]. The
  script appends nothing, and says why, when the partition takes entries under another
  definition (P.def, keys.definition: absent, "migrating", "dropped" or another
  fingerprint) or a shape migration holds the partition (its lease owned by "migrate:…"):
  the publisher then reads the definition again, re-keys those messages and sends them
  again, so no entry keyed under an old layout reaches a log after a migration drained it.

  Job marker: when entries are left unapplied (a delta, a backlog, a migration, append only),
  the script sets the partition's job marker (SET NX PX; when given one) and says so, and
  the publisher enqueues an ingest job; when it applied everything, no worker is woken for
  nothing.

  No error reply after the first XADD: the apply runs under pcall, so an error reply always
  means nothing was appended (the publisher then appends the entries itself with XADD).

  Input (after the partition's KEYS and ARGV head, include partition; ARGV[11] is the
  fingerprint of the caller's definition):
    ARGV[OP + 1] the entries: MessagePack (Redis's cmsgpack) array, each entry the flat
             array of its stream fields and values (sow_redis/model/entries.py make_entry)
    ARGV[OP + 2] job marker lifetime in ms
    ARGV[OP + 3] "1": write-through (apply on a caught-up partition), "0": append only
    ARGV[OP + 4] job marker value ("": set no marker; the caller hands the entries over
             itself)

  Output:
    {entries applied, stream id of the last entry appended, marker, apply error, log length}:
    marker = 1 when entries are left for the workers and this call set the job marker (no job
    was outstanding), else 0; apply error = "" or the text of an error the apply raised (the
    entries are appended all the same; the workers apply them); log length = the log's XLEN
    after the call (a log written through is trimmed by no worker run: the publisher asks
    for one when it grew past the limit, sow_redis.publish.chunk Pass.through_done).
    {-1, why, stored}: nothing appended, the definition fence refused the call; why =
    "migrating" (a migration holds the partition), "absent" (no definition stored for the
    partition), "dropped" (a migration removed the partition) or "changed" (another
    definition is stored); stored = the stored value ("" when absent).
]]
local function apply_appended(P)
  local marker = P.job
  local fields = cmsgpack.unpack(ARGV[OP + 1])

  local trusted_key = P.trusted
  local log_last = ""  -- the log's last entry before this call's (set below)

  -- entries from the i-th on are left for the workers: a trusted range (this call appended
  -- them), and make sure a worker comes (SET NX: one job at a time)
  local function hand_over(entries, i)
    if i > #entries then return 0 end
    local before = log_last
    if i > 1 then before = entries[i - 1][1] end
    add_trusted(trusted_key, before, entries[i][1], entries[#entries][1])
    if ARGV[OP + 4] ~= "" and redis.call("SET", marker, ARGV[OP + 4], "NX", "PX", ARGV[OP + 2]) then
      return 1
    end
    return 0
  end

  local why, stored = definition_refused(P)
  if why then return {-1, why, stored} end
  local meta = redis.call("HMGET", P.state, "cursor", "seq")
  local cursor = meta[1] or "0-0"
  -- the log's last entry before this call's: a trusted range that ends there grows
  local tail = redis.call("XREVRANGE", P.log, "+", "-", "COUNT", 1)
  if #tail > 0 then log_last = tail[1][1] end
  -- only entries this call appends are applied here: none when others wait before them,
  -- that is when the log's last entry lies after the applied cursor (ids in order: pad_id)
  local caught_up = ARGV[OP + 3] == "1"
    and (log_last == "" or pad_id(log_last) <= pad_id(cursor))

  local entries = {}
  for i = 1, #fields do
    entries[i] = {redis.call("XADD", P.log, "*", unpack(fields[i])), fields[i]}
  end
  local last_id = ""
  if #entries > 0 then last_id = entries[#entries][1] end
  if not caught_up then
    return {0, last_id, hand_over(entries, 1), "", redis.call("XLEN", P.log)}
  end

  local applied = 0
  local ok, err = pcall(function()
    local S = batch_state(P, tonumber(meta[2] or "0"), P.expiring, P.dead_letter,
                            P.keep_count, P.keep_ms)
    -- no entry here reads a record (no expiry check without expiration): write them in bulk
    if not P.expiring then S.deferred = new_deferred() end
    local n, last = apply_prepared(P, S, entries, P.ttl, P.nidx)
    if n > 0 then finish_prepared(P, S, last) end
    applied = n
  end)
  if not ok then
    return {0, last_id, hand_over(entries, 1), tostring(err), redis.call("XLEN", P.log)}
  end
  return {applied, last_id, hand_over(entries, applied + 1), "", redis.call("XLEN", P.log)}
end
