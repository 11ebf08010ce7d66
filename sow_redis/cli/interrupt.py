"""Ctrl-C while ``sow-redis`` imports its modules (about 0.3 s at start-up).

Python raises KeyboardInterrupt wherever the signal lands: during the imports that would be a
traceback, before :class:`~sow_redis.cli.common.Main` can end the command as it ends one
interrupted later (status 0 for a command that runs until stopped, else ``interrupted``).
:func:`hold` records a SIGINT instead; :func:`release`, called when a command starts, puts
Python's handler back and says whether one came, so the command raises it there.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

_state = {"held": False, "hit": False}


def _record(_signum: int, _frame: object) -> None:
    _state["hit"] = True


def hold() -> None:
    """Record SIGINT from now on, in the ``sow-redis`` process only (its console script or
    ``python -m sow_redis.cli``: not a program that imports the package), from the main
    thread, and only where SIGINT has Python's own handler (not where it is ignored)."""
    if os.path.basename(sys.argv[0]) not in ("sow-redis", "-m"):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _record)
        _state["held"] = True


def release() -> bool:
    """Python's SIGINT handler again (if :func:`hold` replaced it); True when a SIGINT came
    while it was held."""
    if _state["held"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _state["held"] = False
    hit, _state["hit"] = _state["hit"], False
    return hit
