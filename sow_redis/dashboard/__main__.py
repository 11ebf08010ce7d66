"""``python -m sow_redis.dashboard`` (what ``sow-redis dashboard`` runs)."""

from . import main

main()
