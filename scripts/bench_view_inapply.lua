--[[
  A prototype for scripts/bench_view_inapply.py, not part of sow_redis: the first view of
  scripts/bench_views.py (grouping /g; COUNT(/id), SUM(/qty), AVG(/px) as a sum, MIN(/px),
  MAX(/px), MAX(/n)) kept by a script in the partition of its underlying records, as an
  apply.lua that kept views would keep it: each record's inputs per SOW key (to take its old
  values out), each group's count and sums, and with MINMAX = "1" a sorted set per group and
  field for the extremes (a record's value can leave, so the next least or greatest must be at
  hand); the partition's changed group rows appended to a stream, as a change block would
  carry them. What it leaves out would cost more: removals (sow_delete, expiry), the merge
  of the partitions' partial rows into the view's own records, their change events.

  KEYS[1] inputs hash (SOW key → "g,qty,px"), KEYS[2] group state hash (g → "count,qty,px"),
  KEYS[3] rows stream
  ARGV[1] key prefix of the sorted sets, ARGV[2] MINMAX ("1" or "0"), then per message five:
  SOW key, g, qty, px, n
]]
local W = 5
local m = (#ARGV - 2) / W
local minmax = ARGV[2] == "1"
local ks = {}
for i = 1, m do ks[i] = ARGV[2 + (i - 1) * W + 1] end
local old = redis.call("HMGET", KEYS[1], unpack(ks))
local groups, order = {}, {}
local function group(g)
  local s = groups[g]
  if not s then
    s = {c = 0, q = 0, p = 0, zpx = {}, zn = {}, rem = nil}
    groups[g] = s
    order[#order + 1] = g
  end
  return s
end
local inputs, ni = {}, 0
for i = 1, m do
  local b = 2 + (i - 1) * W
  local key, g, qty, px, n = ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5]
  if old[i] then
    local og, oq, opx = string.match(old[i], "^([^,]*),([^,]*),(.*)$")
    local s = group(og)
    s.c, s.q, s.p = s.c - 1, s.q - tonumber(oq), s.p - tonumber(opx)
    if og ~= g then
      s.rem = s.rem or {}
      s.rem[#s.rem + 1] = key
    end
  end
  local s = group(g)
  s.c, s.q, s.p = s.c + 1, s.q + tonumber(qty), s.p + tonumber(px)
  if minmax then
    local z = s.zpx
    z[#z + 1], z[#z + 2] = px, key
    z = s.zn
    z[#z + 1], z[#z + 2] = n, key
  end
  inputs[ni + 1], inputs[ni + 2] = key, g .. "," .. qty .. "," .. px
  ni = ni + 2
end
redis.call("HSET", KEYS[1], unpack(inputs, 1, ni))
local state = redis.call("HMGET", KEYS[2], unpack(order))
local sets, rows = {}, {}
for j = 1, #order do
  local g = order[j]
  local s = groups[g]
  local c, q, p = 0, 0, 0
  if state[j] then
    local a, b, d = string.match(state[j], "^([^,]*),([^,]*),(.*)$")
    c, q, p = tonumber(a), tonumber(b), tonumber(d)
  end
  c, q, p = c + s.c, q + s.q, p + s.p
  sets[#sets + 1], sets[#sets + 2] = g, c .. "," .. q .. "," .. p
  local row = {g = g, count = c, qty = q, sum_px = p}
  if minmax then
    local kpx, kn = ARGV[1] .. "px:" .. g, ARGV[1] .. "n:" .. g
    if s.rem then
      redis.call("ZREM", kpx, unpack(s.rem))
      redis.call("ZREM", kn, unpack(s.rem))
    end
    if #s.zpx > 0 then
      redis.call("ZADD", kpx, unpack(s.zpx))
      redis.call("ZADD", kn, unpack(s.zn))
    end
    row.lo = redis.call("ZRANGE", kpx, 0, 0, "WITHSCORES")[2]
    row.hi = redis.call("ZRANGE", kpx, -1, -1, "WITHSCORES")[2]
    row.n = redis.call("ZRANGE", kn, -1, -1, "WITHSCORES")[2]
  end
  rows[j] = cjson.encode(row)
end
redis.call("HSET", KEYS[2], unpack(sets))
redis.call("XADD", KEYS[3], "MAXLEN", "~", 1000, "*", "rows", table.concat(rows, "\n"))
return #order
