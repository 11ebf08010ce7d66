"""The read side of changes: bookmarks, the change feed, subscriptions and the SOW-backed
bookmark store (AMPS User Guide: subscriptions, out-of-focus messages, bookmark replay;
seeds/000, seeds/002, seeds/004; ARCHITECTURE §6).

* :mod:`.bookmark`: a topic's position in its change feed, printable as one string;
* :mod:`.changes`: reading the change feed (blocks after a position, the oldest retained
  change, the position at a time);
* :mod:`.subscriber`: ``subscribe``, ``sow_and_subscribe`` and bookmark replay, with
  out-of-focus notices and recovery of every gap;
* :mod:`.bookmark_store`: the SOW-backed bookmark store of seeds/002.
"""
