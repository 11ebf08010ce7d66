"""``python -m sow_redis.cli``: the ``sow-redis`` command."""

from . import main

main()
