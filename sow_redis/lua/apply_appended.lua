--[[
  apply_appended: write-through of a publisher's chunk. Sent by sow_redis's publisher in the
  same write as the XADDs of the chunk (one per partition the chunk touched), it applies the
  prepared plain publishes at the head of the partition's unapplied log, at most `count`
  entries (the number the chunk appended), exactly as the worker's apply_log.lua would
  (include apply_prepared: same records, expiry scores, index members, sequence, change feed
  and change block). A publish to a partition whose workers are caught up is thereby applied
  and delivered to subscribers in the publisher's own round trip, with no worker hop.

  Why it is safe without a fencing token: the script is atomic and starts at the applied
  cursor, so an entry is applied once whoever applies it (the cursor moves past it); it applies
  only entries that need no planning and stops before the first one that does (a delta, a
  sow_delete, a message expiration, a chaining topic's or another client's entry), which a worker
  then plans. A worker batch planned before this script moved the cursor is refused by
  apply.lua (SOW_CONFLICT when the cursor lies inside the batch, "applied before" when past it)
  and planned again from the cursor. During a shape migration (the partition's lease held by a
  "migrate:" owner) the script applies nothing.

  Job marker: when entries are left unapplied after it (a delta, a backlog), the script sets
  the partition's job marker (SET NX PX, as the publisher did before write-through) and says
  so, and the publisher enqueues an ingest job; when it applied everything, no worker is
  woken for nothing.

  Input:
    KEYS: the partition layout of include/remove_record (records, state, expiry, acks, ixm,
          dead, chain, errors, log, changes, change times, hash indexes), then the
          partition's lease, then its job marker
    ARGV[1] partition channel   ARGV[2] topic name     ARGV[3] n (number of hash indexes)
    ARGV[4] "1" when the topic has a dead_letter topic
    ARGV[5] "1" when the topic's expiration is enabled     ARGV[6] count (entries read at most)
    ARGV[7] the topic's expiry of a message without its own expiration: "" (none), "now"
            (TTL 0 under policy min) or a lifetime in ms added to the entry's stream id time
    ARGV[8] partition number
    ARGV[9] change feed retention: changes kept per partition (0: no feed, pub/sub only)
    ARGV[10] change feed retention in ms (0: by count only)
    ARGV[11] job marker lifetime in ms     ARGV[12] job marker value

  Output:
    {entries applied, cursor, marker}: marker = 1 when entries are left for the workers and
    this call set the job marker (no job was outstanding), else 0.
]]
local chan, topic, nidx = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dead_letter, expiring = ARGV[4] == "1", ARGV[5] == "1"
local count, ttl, partition = tonumber(ARGV[6]), ARGV[7], ARGV[8]

--@include event
--@include remove_record
--@include write_record
--@include apply_prepared

local P = partition_context(chan, topic, partition, nidx)
local marker = KEYS[13 + nidx]

-- entries left after the cursor: make sure a worker comes (SET NX: one job at a time)
local function hand_over(left)
  if left and redis.call("SET", marker, ARGV[12], "NX", "PX", ARGV[11]) then
    return 1
  end
  return 0
end

local owner = redis.call("GET", KEYS[12 + nidx])
if owner and string.sub(owner, 1, 8) == "migrate:" then
  return {0, "", 0}
end
local meta = redis.call("HMGET", P.state, "cursor", "seq")
local cursor = meta[1] or "0-0"
-- one entry more than this script may apply tells whether the log holds more after them
local entries = redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", count + 1)
if #entries == 0 then return {0, cursor, 0} end
local more = #entries > count
if more then entries[#entries] = nil end
local S = batch_state(P, tonumber(meta[2] or "0"), expiring, dead_letter, ARGV[9], ARGV[10])
-- no entry here reads a record (no expiry check without expiration): write them in bulk
if not expiring then S.deferred = new_deferred() end

local applied, last = apply_prepared(P, S, entries, ttl, nidx)
if applied > 0 then
  cursor = last
  finish_prepared(P, S, cursor)
end
return {applied, cursor, hand_over(more or applied < #entries)}
