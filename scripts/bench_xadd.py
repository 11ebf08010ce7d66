#!/usr/bin/env python3
"""The publisher's send path: redis-py pipelined XADD against hand-packed RESP and one Lua
call per chunk, for the same log entries.

Starts its own redis-server on a free loopback port (``--save "" --appendonly no``, in a
temporary folder; never 6379). Appends N entries (``cmd``, ``data``, ``sow_key`` fields, as
:func:`sow_redis.publish.append.append` writes them; messages like ``bench_ingest.py``) round
robin to 8 streams, 1,000 per round trip, three ways:

* ``redis-py pipeline``: ``pipe.xadd(...)`` per entry and ``execute()`` per 1,000 (today);
* ``hand-packed RESP``: the same XADD commands written as RESP bytes by this script, sent
  with one ``send_packed_command`` per 1,000 and the replies read with ``read_response``;
* ``Lua + msgpack``: one EVALSHA per 1,000 with one MessagePack argument (``use_bin_type=
  False``: the ``cmsgpack`` of Redis 7.0 refuses the bin types), the script XADDs each entry.
  (Its stream keys are not declared in KEYS: fine on one server, not on a cluster.)

No validation, key or partition work is timed: only building and sending the commands.
Prints µs per entry (wall, this process's CPU, redis-server CPU) and msg/s per run; each
variant runs ``--repeat`` times, alternating. The streams must hold N entries after each run.

Example::

    .venv/bin/python scripts/bench_xadd.py --n 100000
"""

from __future__ import annotations

import argparse
import sys
import time

import msgpack
from bench_ingest import make_messages
from benchlib import BenchError, private_redis, redis_cpu_s, write_json
from redis import Redis

CHUNK = 1000
SOW_KEY = "abcdefghijklmnopqrstuv"
LUA = """
local a = cmsgpack.unpack(ARGV[1])
local out = {}
for i = 1, #a, 3 do
  out[#out + 1] = redis.call('XADD', a[i], '*', 'cmd', 'publish', 'data', a[i + 1],
                             'sow_key', a[i + 2])
end
return out
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default="bench-results/bench_xadd.json")
    a = ap.parse_args(argv)
    n = a.n
    msgs = make_messages(n, n, a.size)
    streams = [f"{{bench:xadd:{p}}}:log" for p in range(8)]
    keys = [streams[i % 8] for i in range(n)]
    try:
        with private_redis("sow-xadd-") as server:
            r = Redis.from_url(server.url)

            def pipeline() -> None:
                p = r.pipeline(transaction=False)
                for i in range(n):
                    p.xadd(keys[i], {"cmd": "publish", "data": msgs[i], "sow_key": SOW_KEY})
                    if len(p) >= CHUNK:
                        p.execute()
                p.execute()

            def resp() -> None:
                conn = r.connection_pool.get_connection()
                try:
                    for s in range(0, n, CHUNK):
                        parts = []
                        for i in range(s, min(n, s + CHUNK)):
                            k, d = keys[i].encode(), msgs[i]
                            parts.append(b"*9\r\n$4\r\nXADD\r\n$%d\r\n%s\r\n$1\r\n*\r\n$3\r\ncmd\r\n"
                                         b"$7\r\npublish\r\n$4\r\ndata\r\n$%d\r\n%s\r\n$7\r\nsow_key"
                                         b"\r\n$22\r\n%s\r\n" % (len(k), k, len(d), d,
                                                                 SOW_KEY.encode()))
                        conn.send_packed_command([b"".join(parts)], check_health=False)
                        for _ in range(s, min(n, s + CHUNK)):
                            conn.read_response()
                finally:
                    r.connection_pool.release(conn)

            def lua() -> None:
                for s in range(0, n, CHUNK):
                    args: list = []
                    for i in range(s, min(n, s + CHUNK)):
                        args += (keys[i], msgs[i], SOW_KEY)
                    r.evalsha(sha, 0, msgpack.packb(args, use_bin_type=False))

            runs = []
            for rep in range(a.repeat):
                for name, f in (("redis-py pipeline", pipeline), ("hand-packed RESP", resp),
                                ("Lua + msgpack", lua)):
                    r.unlink(*streams)
                    sha = r.script_load(LUA)
                    c0, p0, t0 = redis_cpu_s(r), time.process_time(), time.perf_counter()
                    f()
                    wall = time.perf_counter() - t0
                    x = {"variant": name, "run": rep + 1, "wall_us": 1e6 * wall / n,
                         "client_cpu_us": 1e6 * (time.process_time() - p0) / n,
                         "redis_cpu_us": 1e6 * (redis_cpu_s(r) - c0) / n, "msg_s": n / wall}
                    total = sum(r.xlen(s) for s in streams)
                    if total != n:
                        raise BenchError(f"{name}: {total} entries, expected {n}")
                    runs.append(x)
                    print(f"{name:18s} run {rep + 1}: {x['wall_us']:5.2f} µs/entry wall, client "
                          f"CPU {x['client_cpu_us']:5.2f}, redis CPU {x['redis_cpu_us']:5.2f}, "
                          f"{x['msg_s']:9,.0f} msg/s")
            print(f"written: {write_json(a.json, {'options': vars(a), 'runs': runs})}")
            return 0
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
