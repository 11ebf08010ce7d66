--[[
  include apply_load: apply_load(P), the "load" operation of apply.lua: one batch of a bulk
  load (sow-redis spark load / stream) into a partition, in the load's order and exactly once: appended to the transaction log and applied in the same
  atomic call, or staged until the batches ahead of it are applied.

  A load's rows come in splits (Spark tasks, in input order), each split's rows of this
  partition in batches 0, 1, … (the last one flagged). The partition's loads hash keeps the
  load's position, field "<load id>" = "<split>:<batch>" of the next batch to apply (absent:
  "0:0"), and, for a split whose last batch was staged, "<load id>:<split>" = its number of
  batches. A batch:
    * before the position was applied before (a retried task, a replayed micro-batch, the
      same load run again): nothing is written;
    * after it is staged in the partition's staged hash (field "<load id>:<split>:<batch>")
      and applied later by whichever call reaches it;
    * at it is applied: its entries XADDed to the log as the publisher appends them and
      applied at once with include apply_prepared (the same upsert, expiry scores, index
      members, sequence, change feed and change block as the workers' apply.lua (log)), its
      rejected rows added to the partition's error stream, the position moved; then the staged
      batches that follow are applied the same way, `max batches` in all.
  A call with split -1 only applies staged batches from the position.

  Why no fencing token: as for apply.lua (appended), the call is atomic and applies only when
  the log holds no unapplied entry (else it writes nothing and says so; the caller applies
  those with the workers' path first), so an entry is applied once whoever applies it, and a
  worker batch planned before it is refused by apply.lua (its entries are applied). It writes
  nothing during a shape migration (the lease held by a "migrate:" owner), nor when the
  partition stores another definition than the load's (include partition definition_refused;
  a partition with none stored, as before issue 23.4, takes the load).

  Input (after the partition's KEYS and ARGV head, include partition):
    ARGV[OP + 1] load id   ARGV[OP + 2] split (-1: apply staged batches only)
    ARGV[OP + 3] batch     ARGV[OP + 4] "1" when this is the split's last batch of this
             partition
    ARGV[OP + 5] the batch: MessagePack (Redis's cmsgpack) of [entries, rejected rows], each
             entry the flat array of its log entry's field names and values
             (sow_redis/model/entries.py, with the SOW key "k" and index members "m" the publisher
             computed), each rejected row [reason, detail, data]
    ARGV[OP + 6] max batches applied by this call
    ARGV[OP + 7] the load's number of splits: recorded by the first call
             ("<load id>:splits"); a call of the same load with another number is refused
             (its batches would not line up with the ones applied)
  Output:
    {status, entries applied, rejected rows written, next split, next batch}
    status: 0 applied (or nothing to apply), 1 staged, 2 applied before,
            3 the log holds unapplied entries (nothing written, or the batches up to an entry
              the workers must plan were), 4 a shape migration holds the partition,
            5 the load ran with another number of splits (nothing written),
            6 the partition stores another definition of the topic than the load's
              (config apply changed it; nothing written)
]]
local function apply_load(P)
  local load_id, split, batch = ARGV[OP + 1], tonumber(ARGV[OP + 2]), tonumber(ARGV[OP + 3])
  local last, max_batches = ARGV[OP + 4] == "1", tonumber(ARGV[OP + 6])
  local loads, staged = P.loads, P.staged

  local splits = ARGV[OP + 7]
  local had = redis.call("HGET", loads, load_id .. ":splits")
  if had and had ~= splits then
    return {5, 0, 0, tonumber(had), 0}
  end
  local pos = redis.call("HGET", loads, load_id) or "0:0"
  local ns, nb = string.match(pos, "^(%d+):(%d+)$")
  ns, nb = tonumber(ns), tonumber(nb)

  if not had then redis.call("HSET", loads, load_id .. ":splits", splits) end
  if split >= 0 then
    if split < ns or (split == ns and batch < nb) then
      return {2, 0, 0, ns, nb}
    end
    if split > ns or batch > nb then
      redis.call("HSET", staged, load_id .. ":" .. split .. ":" .. batch, ARGV[OP + 5])
      if last then redis.call("HSET", loads, load_id .. ":" .. split, batch + 1) end
      return {1, 0, 0, ns, nb}
    end
  end

  local why = definition_refused(P)
  if why == "migrating" then
    return {4, 0, 0, ns, nb}
  elseif why and why ~= "absent" then  -- keyed under a definition no longer stored
    return {6, 0, 0, ns, nb}
  end
  local meta = redis.call("HMGET", P.state, "cursor", "seq")
  local cursor = meta[1] or "0-0"
  if #redis.call("XRANGE", P.log, "(" .. cursor, "+", "COUNT", 1) > 0 then
    return {3, 0, 0, ns, nb}
  end

  local S = batch_state(P, tonumber(meta[2] or "0"), P.expiring, P.dead_letter, P.keep_count,
                          P.keep_ms)
  if not P.expiring then S.deferred = new_deferred() end
  local applied, rejected, done, stopped = 0, 0, 0, false

  -- append and apply one batch (its MessagePack text), then move the position past it
  local function apply_batch(packed, is_last)
    local b = cmsgpack.unpack(packed)
    local fields, rejects = b[1], b[2]
    local entries = {}
    for i = 1, #fields do
      entries[i] = {redis.call("XADD", P.log, "*", unpack(fields[i])), fields[i]}
    end
    for i = 1, #rejects do
      local rej = rejects[i]
      redis.call("XADD", P.errors, "MAXLEN", "~", 100000, "*", "reason", rej[1],
        "detail", rej[2], "data", rej[3], "load", load_id)
    end
    rejected = rejected + #rejects
    local n, id, stop = apply_prepared(P, S, entries, P.ttl, P.nidx)
    applied = applied + n
    if n > 0 then cursor = id end
    stopped = stop
    done = done + 1
    if is_last then
      redis.call("HDEL", loads, load_id .. ":" .. ns)
      ns, nb = ns + 1, 0
    else
      nb = nb + 1
    end
  end

  if split >= 0 then apply_batch(ARGV[OP + 5], last) end
  while done < max_batches and not stopped do
    local field = load_id .. ":" .. ns .. ":" .. nb
    local packed = redis.call("HGET", staged, field)
    if not packed then break end
    redis.call("HDEL", staged, field)
    local count = redis.call("HGET", loads, load_id .. ":" .. ns)
    apply_batch(packed, count and tonumber(count) == nb + 1)
  end

  if applied > 0 then finish_prepared(P, S, cursor) end
  if done > 0 then redis.call("HSET", loads, load_id, ns .. ":" .. nb) end
  if stopped then return {3, applied, rejected, ns, nb} end
  return {0, applied, rejected, ns, nb}
end
