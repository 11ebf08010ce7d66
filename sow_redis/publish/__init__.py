"""Publishing: appending messages to a topic's transaction log (:mod:`.append`), the
definition fence a publisher honours during a migration, and what a publish returns
(:mod:`.result`)."""
