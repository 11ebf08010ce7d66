"""Message forms, no Redis: values and field paths, SOW keys, FIX, parsed messages, log entries,
stored records, change events and chain identifiers.

Everything here is a pure function of its input; the processes that read and write Redis
(:mod:`sow_redis.apply`, :mod:`sow_redis.query`, :mod:`sow_redis.feed`, the publisher) share
these definitions, so each format has one.
"""
