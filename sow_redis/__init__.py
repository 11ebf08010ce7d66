"""sow_redis: a State of the World (SOW) message database on Redis.

The SOW keeps, for every topic, the latest message for each distinct SOW key
(AMPS User Guide ch. 7, "State of the World"; seeds/004).
"""

from __future__ import annotations

__version__ = "0.1.0"
