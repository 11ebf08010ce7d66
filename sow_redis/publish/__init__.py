"""Publishing: appending messages to a topic's transaction log.

* :mod:`.append`: the loop (validate, chunk, hand over), and the names callers import;
* :mod:`.validate`: each item checked and turned into its log entry, or rejected;
* :mod:`.chunk`: a chunk and the state of one pass; :mod:`.sinks` (one server) and
  :mod:`.cluster` (a Redis Cluster, durable publishes): how chunks reach Redis, chosen once
  per pass; :mod:`.wire` (RESP by hand), :mod:`.commands` (pipelines per node, ``WAIT``),
  :mod:`.through` (apply.lua's write-through);
* :mod:`.fence`: the definition fence a publisher honours during a migration;
* :mod:`.retry`: publishing in blocks through a Redis outage;
* :mod:`.wait`, :mod:`.used`, :mod:`.delete`: waiting until applied, the topic's last use,
  deletes by filter or keys;
* :mod:`.result`: what a publish returns.
"""
