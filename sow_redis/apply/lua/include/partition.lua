--[[
  include partition: the one definition of a partition's KEYS and of the head of ARGV, shared
  by every script that works on one partition (apply.lua, the one apply entry point;
  expire.lua; delete_now.lua). Python builds both in one place, in the same order
  (sow_redis.keys.partition_keys, sow_redis.apply.scripts.Partition); Lua never builds a key name.

  KEYS[1] records   KEYS[2] state   KEYS[3] expiry   KEYS[4] acks   KEYS[5] index members
  KEYS[6] dead-letter outbox   KEYS[7] chain   KEYS[8] errors   KEYS[9] log
  KEYS[10] change feed (stream)   KEYS[11] change feed block times (zset)   KEYS[12] lease
  KEYS[13] job marker   KEYS[14] trusted ranges   KEYS[15] definition fingerprint
  KEYS[16] loads   KEYS[17] staged load batches   KEYS[18 .. 17 + n] the n indexes (hash
  indexes, then range indexes: TopicConfig.n_indexes), then the numbers' sorted sets of the
  last r of them, the range indexes (r = #KEYS - 17 - n; P.num[j] for index j, nil for a
  hash index; sow_redis.model.rangeindex)

  ARGV[1] the operation (apply.lua: "planned", "log", "appended", "load"; the other scripts
  their own name)
  ARGV[2] partition channel   ARGV[3] topic name   ARGV[4] partition number
  ARGV[5] n (number of indexes, hash and range)   ARGV[6] "1" when the topic has a dead_letter topic
  ARGV[7] "1" when the topic's expiration is enabled
  ARGV[8] change feed retention: changes kept per partition (0: no feed, pub/sub only)
  ARGV[9] change feed retention in ms (0: by count only)
  ARGV[10] the topic's expiry of a message without its own expiration: "" (none), "now"
           (TTL 0 under policy min) or a lifetime in ms added to the entry's stream id time
  ARGV[11] the fingerprint of the caller's topic definition (TopicConfig.fingerprint)
  ARGV[12] "1" when the topic's change events carry each record's previous state
           (change_previous; include event), "2" when they carry it as what differs
           (a topic that keeps history: include reverse_delta), "0" otherwise
  ARGV[OP + i] the operation's own i-th argument (OP = 12)
]]
local OP = 12

local function partition_context()
  local nidx = tonumber(ARGV[5])
  local idx = {}
  for j = 1, nidx do idx[j] = KEYS[17 + j] end
  local num, nrange = {}, #KEYS - 17 - nidx
  for j = 1, nrange do num[nidx - nrange + j] = KEYS[17 + nidx + j] end
  return {
    rec = KEYS[1], state = KEYS[2], exp = KEYS[3], acks = KEYS[4], ixm = KEYS[5],
    dead = KEYS[6], chain = KEYS[7], errors = KEYS[8], log = KEYS[9], changes = KEYS[10],
    change_times = KEYS[11], lease = KEYS[12], job = KEYS[13], trusted = KEYS[14],
    def = KEYS[15], loads = KEYS[16], staged = KEYS[17], idx = idx, num = num,
    chan = ARGV[2], topic = ARGV[3], partition = ARGV[4], nidx = nidx,
    dead_letter = ARGV[6] == "1", expiring = ARGV[7] == "1",
    keep_count = ARGV[8], keep_ms = ARGV[9], ttl = ARGV[10], fingerprint = ARGV[11],
    previous = ARGV[12] == "1" or ARGV[12] == "2", reverse = ARGV[12] == "2",
  }
end

-- nil when the caller's definition is the stored one and no migration holds the partition
-- (its lease owned by "migrate:…"); else why not ("migrating", "absent", "dropped",
-- "changed") and the stored value. The definition fence of the callers that hold no fencing
-- token (issue 23.4). One MGET: a small publish pays for every redis.call.
local function definition_refused(P)
  local got = redis.call("MGET", P.def, P.lease)
  local stored, owner = got[1], got[2]
  if owner and string.sub(owner, 1, 8) == "migrate:" then return "migrating", stored or "" end
  if stored == P.fingerprint then return nil end
  if not stored then return "absent", "" end
  if stored == "migrating" or stored == "dropped" then return stored, stored end
  return "changed", stored
end
