"""A lower CPU priority for work that may yield to the write path (the deriver).

A view or conflated topic is derived data. Where its publishers matter more than its lag, the
deriver asks the scheduler for less CPU than the workers, the publishers and redis-server
when they compete, and takes the idle CPU to catch up (``sow-redis derive --nice N``, default
:data:`DERIVE_NICE`; 0 keeps the priority it was started with: the views' lowest latency,
at the publishers' cost on a machine without a core to spare; ``docs/views.md``).

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

__all__ = ["DERIVE_NICE", "lower_priority"]

DERIVE_NICE = 10
"""The deriver's default nice increment (``sow-redis derive --nice``, ``SOW_DERIVE_NICE``).
On the 2-core project machine (``scripts/bench_views.py``, 2026-11-28, runs of three rounds)
the publish rate with one view was 0.80–0.94 of the rate without it at 10 (four runs),
against 0.60–0.69 at 0 (three); the view's lag p99 at 10,000 changes/s 8.9–37.9 ms at 10
(median of nine runs 20.4 ms), against 8.0–10.4 ms at 0 (five), and 6.5–16.5 ms at 10
(eight runs) once the deriver settled its heap (:func:`sow_redis.derive.settle_heap`;
``docs/views.md``, Priority)."""

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
