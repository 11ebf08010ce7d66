"""The write path: from a partition's transaction log to its SOW records.

A worker holding a partition's lease (:mod:`.jobs`) reads the log, computes SOW keys
(:mod:`.keying`, chain lookups in :mod:`.chaining`), plans the operations (:mod:`.applier`,
typed in :mod:`.ops`) and applies them with one atomic Lua entry point (``lua/apply.lua``,
loaded by :mod:`.scripts`), which also keeps the expiry scores and writes the change events.
"""
