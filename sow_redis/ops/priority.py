"""A lower CPU priority for work that may yield to the write path (the deriver).

A view or conflated topic is derived data. Where its publishers matter more than its lag, the
deriver can ask the scheduler for less CPU than the workers, the publishers and redis-server
when they compete, and take the idle CPU to catch up (``sow-redis derive --nice N``; default
0, because a lower priority costs the view's latency: ``docs/views.md``).

On Linux two settings decide it: the process's nice value (``setpriority``), which weighs it
against the processes of its own session, and, when the kernel groups processes by session
("autogroup", ``/proc/sys/kernel/sched_autogroup_enabled``; the default of most desktop and
many server kernels), the nice value of its session's group, which weighs it against every
other session: ``sow-redis up`` starts each child in a session of its own, so there only the
group's value counts. Under systemd or Kubernetes the service's cgroup weighs it instead
(``CPUWeight=`` of the unit, the pod's CPU request; ``docs/views.md``).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["lower_priority"]

AUTOGROUP = Path("/proc/self/autogroup")
"""Linux: the session group of this process (``/autogroup-N nice K``; writing a number sets
K, which a process may raise but not lower without privilege)."""


def lower_priority(nice: int) -> tuple[int, int | None]:
    """Raise this process's nice value by ``nice`` (0: leave it as it is), and, when this
    process leads its own session on a kernel that groups by session, its group's nice value
    to the same.

    Args:
        nice: 0–19, the increment (``nice(1)``'s ``-n``).

    Returns:
        ``(process nice, group nice)`` after the change; group nice None where there is no
        session group or this process does not lead its session (the group then holds other
        processes, whose priority is not this process's to lower).

    Raises:
        ValueError: ``nice`` outside 0–19.
    """
    if not 0 <= nice <= 19:
        raise ValueError(f"nice must be 0-19, got {nice}")
    now = os.nice(nice) if nice else os.nice(0)
    group = None
    if hasattr(os, "getsid") and os.getsid(0) == os.getpid():
        try:
            if nice:
                AUTOGROUP.write_text(str(now))
            group = int(AUTOGROUP.read_text().split()[-1])
        except (OSError, ValueError, IndexError):  # no autogroup, or not Linux
            group = None
    return now, group
