--[[
  lease_release: give up a partition lease, only if the caller still holds it.

  Input:
    KEYS[1] lease  STRING owner id
    ARGV[1] owner id
  Output:
    1 when released, 0 when the lease was not the caller's.
]]
if redis.call("GET", KEYS[1]) == ARGV[1] then
  redis.call("DEL", KEYS[1])
  return 1
end
return 0
