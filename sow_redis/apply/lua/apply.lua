--[[
  apply: the one entry point through which a partition's SOW changes, whoever hands the
  entries over (issue 23, item 6). Every caller passes the partition's KEYS and the head of
  ARGV in one order (include partition; sow_redis.apply.scripts.Partition builds them), and names
  its operation in ARGV[1]:

    "planned"   a worker's batch, planned in Python from the log entries it read and
                verified (delta merges, deletes, expirations, chain links, rejections):
                include apply_planned; fencing token
    "log"       a worker's run of plain publishes read by the script from the log, applied
                inside trusted ranges or up to the id the worker verified: include
                apply_from_log; fencing token
    "appended"  a publisher's chunk, appended by the script and written through when the
                log is caught up, else recorded as a trusted range: include
                apply_appended; definition fence
    "load"      a Spark load's batch, appended and applied in the load's order, exactly
                once: include apply_load; definition fence

  One trust rule for all of them: an entry is applied only if its SOW key, partition and
  index members are what the topic's definition gives for its data. The worker operations
  apply what the worker verified (or what a trusted caller appended); the operations without
  a fencing token apply only entries they append themselves, on a caught-up log, under the
  definition stored for the partition (include partition definition_refused). They share the
  record writes (include write_record), removals and the change feed (include
  remove_record), the change events (include event) and the prepared-publish loop (include
  apply_prepared). expire.lua (due records) and delete_now.lua (a delete that must run out
  of memory: flagged allow-oom, which no apply may be) are the two other scripts that write
  records; they take the same KEYS and ARGV head.

  Input: the partition's KEYS and ARGV head (include partition), ARGV[1] naming the
    operation; the operation's own arguments ARGV[OP + 1 ..]: see its include.
  Output: the operation's (see its include); error reply "SOW_BADARGS unknown operation …".
]]
--@include partition
--@include expiry
--@include event
--@include remove_record
--@include reverse_delta
--@include write_record
--@include apply_prepared
--@include apply_planned
--@include apply_from_log
--@include apply_appended
--@include apply_load

local P = partition_context()
local op = ARGV[1]
if op == "planned" then return apply_planned(P) end
if op == "log" then return apply_from_log(P) end
if op == "appended" then return apply_appended(P) end
if op == "load" then return apply_load(P) end
return redis.error_reply("SOW_BADARGS unknown operation " .. tostring(op))
