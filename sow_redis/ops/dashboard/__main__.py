"""``python -m sow_redis.ops.dashboard`` (what ``sow-redis dashboard`` runs)."""

from . import main

main()
