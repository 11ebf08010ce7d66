--[[
  lease_acquire: take (or keep) the lease of a partition and return its fencing token.

  Input:
    KEYS[1] lease  STRING owner id (PX lifetime)
    KEYS[2] state  HASH field "fence": the fencing token counter
    ARGV[1] owner id    ARGV[2] lease time in milliseconds
  Output:
    the fencing token (integer) when the caller holds the lease, else false (nil).
    A new owner gets a new token, so a previous owner's batches are refused by apply.
]]
local owner = redis.call("GET", KEYS[1])
if owner == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], ARGV[2])
  return tonumber(redis.call("HGET", KEYS[2], "fence"))
end
if owner then
  return false
end
redis.call("SET", KEYS[1], ARGV[1], "PX", ARGV[2])
return redis.call("HINCRBY", KEYS[2], "fence", 1)
