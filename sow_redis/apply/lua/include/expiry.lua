--[[
  include expiry: the rules of SOW expiration in Lua, one place (the Python side:
  sow_redis.model.expiry). Included by every script that removes or reads past records:
  apply.lua, expire.lua, delete_now.lua.

  A record's expiry is absolute ms since the epoch on the Redis server clock, kept in its
  header and as its score in the partition's expiry set; 0 = never.
  is_due(exp_ms, at_ms): a record with expiry exp_ms is due at at_ms (exp_ms > 0 and exp_ms <=
  at_ms): a reader no longer returns it, a write at or after at_ms first removes it.
  due_keys(P, at_ms, limit): the keys due at at_ms, earliest first, at most limit (the same
  rule on the expiry set's scores).
  now_ms(): the server clock (TIME) in ms.
]]
local function is_due(exp_ms, at_ms)
  return exp_ms > 0 and exp_ms <= at_ms
end

local function due_keys(P, at_ms, limit)
  return redis.call("ZRANGEBYSCORE", P.exp, 1, at_ms, "LIMIT", 0, limit)
end

local function now_ms()
  local t = redis.call("TIME")
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
