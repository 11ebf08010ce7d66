"""Running and watching sow_redis: ``sow-redis up`` (:mod:`.server`), the worker process
(:mod:`.worker`), status and statistics (:mod:`.status`), Prometheus metrics (:mod:`.metrics`),
the dashboard (:mod:`.dashboard`), shape migrations (:mod:`.migrate`) and the AMPS
configuration import (:mod:`.amps_import`)."""
