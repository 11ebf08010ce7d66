"""What the per-message checks of ``messages.decode`` cost (integer range, nesting depth).

Compares ``decode`` with the bare decoder it wraps (``orjson.loads`` + the object check, the
decode of before the checks) on four kinds of messages, in nanoseconds per message. No Redis.

    python scripts/bench_decode.py
"""

from __future__ import annotations

import timeit

import orjson

from sow_redis.config import parse_topics
from sow_redis.errors import MessageError
from sow_redis.model.messages import decode

TOPIC = parse_topics('[[topic]]\nname = "b"\nkey = ["/orderId"]\n')[0]

CASES = {
    "order, 130 B": b'{"orderId": 12345, "sym": "IBM", "px": 120.5, "qty": 100, "side": "B", '
                    b'"ts": "2024-01-01T00:00:00Z", "legs": {"a": [1, 2, 3]}}',
    "flight-like, 1.5 KB": orjson.dumps({"id": "x" * 40, **{f"f{i}": i * 1.5 for i in range(40)},
                                       "pad": "y" * 1000}),
    "19-digit ns timestamp (slow path)": b'{"orderId": 1, "ts_ns": 1700000000123456789, '
                                        b'"sym": "IBM"}',
    "600 brackets, depth 3 (depth path)": orjson.dumps({"orderId": 1,
                                                        "m": [[[i]] for i in range(100)]}),
}


def bare(data: bytes) -> dict:
    obj = orjson.loads(data)
    if not isinstance(obj, dict):
        raise MessageError("not_object", "")
    return obj


def per_call_ns(fn, data: bytes, n: int = 20000) -> float:
    return min(timeit.repeat(lambda: fn(data), number=n, repeat=5)) / n * 1e9


def main() -> None:
    print(f"{'message':38s} {'bare ns':>8s} {'decode ns':>10s} {'added':>7s}")
    for name, data in CASES.items():
        a, b = per_call_ns(bare, data), per_call_ns(lambda d: decode(d, TOPIC), data)
        print(f"{name:38s} {a:8.0f} {b:10.0f} {b - a:+7.0f}")


if __name__ == "__main__":
    main()
