#!/usr/bin/env python3
"""Argument packing for apply.lua: flat ARGV (5 fields per op) against one MessagePack blob.

Starts its own redis-server on a free loopback port (``--save "" --appendonly no``, in a
temporary folder; never 6379). Builds N upserts once (messages like ``bench_ingest.py``:
~``--size`` bytes of JSON; a 22-character SOW key; a stream id), then for each batch size
of ``--batches`` and each packing, applies all N in batches of that size, one script call
per batch and one call per round trip (as a worker does), to a fresh records hash:

* ``flat``: today's apply.lua layout: ``op, stream id, sow_key, data, meta`` per op in ARGV
  (redis-py packs every argument);
* ``msgpack``: one argument, ``msgpack.packb([[op, id, key, data, meta], ...])``,
  unpacked in Lua with the ``cmsgpack.unpack`` built into Redis;
* ``msgpack-flat``: one argument, one flat MessagePack array of 5 × n values;
* ``flat-nowrite`` (only when asked for with ``--packings``): ``flat`` without the HSET per
  op, to split the server time into argument handling and the write.

Each script does the same Redis work per op as apply.lua does for a publish on a topic with
no expiry, index or subscriber (parse ``meta``, build ``<seq>:<expiry>:<id>\\n<data>``,
``HSET`` it) and stores the cursor and seq once per batch.

Columns (per message, µs): ``build`` = Python time to make the call's arguments (and, for
msgpack, to pack them), measured on its own; ``client CPU`` = this process's CPU per message
over the end-to-end run (building, packing the RESP command, parsing the reply); ``server``
= the script's own time in Redis (``INFO commandstats`` usec of evalsha); ``redis CPU`` =
redis-server's user+sys CPU (``INFO cpu``), which also counts reading the arguments;
``e2e`` = wall time per message from the first call to the last reply. ``msg/s`` = N / e2e.
Every variant runs ``--repeat`` times, alternating, in this process, on the same data;
the best e2e run of each is shown. After each run the records hash must hold ``min(N,
keys)`` records and the stored seq must be N.

Example::

    .venv/bin/python scripts/bench_packing.py --n 100000 --batches 100,500,2000
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import platform
import sys
import time
import uuid
from typing import Any

import msgpack
from bench_ingest import make_messages
from benchlib import BenchError, private_redis, redis_cpu_s, write_json
from redis import Redis
from rich.console import Console
from rich.table import Table

console = Console(width=130)

_BODY = """
local function parse_meta(meta)
  if meta == "" then return "", "-", "" end
  return string.match(meta, "^([^|]*)|([^|]*)|(.*)$")
end
local rec, st = KEYS[1], KEYS[2]
local seq = tonumber(redis.call("HGET", st, "seq") or "0")
local last = ""
local function upsert(op, id, key, data, meta)
  local ex = parse_meta(meta)
  seq = seq + 1
  local exp_ms = ex
  if ex == "" then exp_ms = "0" end
  redis.call("HSET", rec, key, seq .. ":" .. exp_ms .. ":" .. id .. "\\n" .. data)
  last = id
end
"""

SCRIPTS = {
    "flat": _BODY + """
for i = 1, #ARGV, 5 do
  upsert(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
redis.call("HSET", st, "cursor", last, "seq", seq)
return seq
""",
    "msgpack": _BODY + """
local ops = cmsgpack.unpack(ARGV[1])
for i = 1, #ops do
  local o = ops[i]
  upsert(o[1], o[2], o[3], o[4], o[5])
end
redis.call("HSET", st, "cursor", last, "seq", seq)
return seq
""",
    "msgpack-flat": _BODY + """
local a = cmsgpack.unpack(ARGV[1])
for i = 1, #a, 5 do
  upsert(a[i], a[i + 1], a[i + 2], a[i + 3], a[i + 4])
end
redis.call("HSET", st, "cursor", last, "seq", seq)
return seq
""",
    "flat-nowrite": _BODY.replace('redis.call("HSET", rec, key,', 'local _ = (') + """
for i = 1, #ARGV, 5 do
  upsert(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4])
end
redis.call("HSET", st, "cursor", last, "seq", seq)
redis.call("HSET", rec, "k", "v")
return seq
""",
}
"""Lua source per packing: the same per-op work as apply.lua's publish path
(``flat-nowrite``, a diagnostic not in the default set: the same but without the HSET per
op, so server time minus its server time is what one ``redis.call("HSET")`` costs)."""


def make_ops(msgs: list[bytes], nkeys: int) -> list[tuple[str, str, str, bytes, str]]:
    """``(op, stream id, sow_key, data, meta)`` per message, like the worker's plan."""
    base_ms = 1_700_000_000_000
    ops = []
    for i, m in enumerate(msgs):
        key = base64.b64encode((i % nkeys).to_bytes(16, "big")).decode()[:22]
        ops.append(("publish", f"{base_ms + i // 50}-{i % 50}", key, m, ""))
    return ops


def build_flat(batch: list[tuple]) -> list[Any]:
    argv: list[Any] = []
    for o, sid, key, data, meta in batch:
        argv += [o, sid, key, data, meta]
    return argv


def build_msgpack(batch: list[tuple]) -> list[Any]:
    return [msgpack.packb(batch, use_bin_type=False)]


def build_msgpack_flat(batch: list[tuple]) -> list[Any]:
    argv: list[Any] = []
    for op in batch:
        argv += op
    return [msgpack.packb(argv, use_bin_type=False)]


BUILDERS = {"flat": build_flat, "msgpack": build_msgpack, "msgpack-flat": build_msgpack_flat,
            "flat-nowrite": build_flat}


def evalsha_usec(r: Redis) -> tuple[int, int]:
    s = r.info("commandstats").get("cmdstat_evalsha", {"calls": 0, "usec": 0})
    return s["calls"], s["usec"]


def run(r: Redis, sha: str, packing: str, ops: list[tuple], batch: int,
        distinct: int) -> dict[str, Any]:
    build = BUILDERS[packing]
    n = len(ops)
    batches = [ops[s:s + batch] for s in range(0, n, batch)]
    t0 = time.perf_counter()
    for b in batches:  # build cost on its own
        build(b)
    build_s = time.perf_counter() - t0
    tag = uuid.uuid4().hex[:8]
    ks = [f"bench:pack:{tag}:rec", f"bench:pack:{tag}:state"]
    calls0, usec0 = evalsha_usec(r)
    cpu0, pcpu0 = redis_cpu_s(r), time.process_time()
    t0 = time.perf_counter()
    for b in batches:
        r.evalsha(sha, 2, *ks, *build(b))
    e2e = time.perf_counter() - t0
    pcpu = time.process_time() - pcpu0
    rcpu = redis_cpu_s(r) - cpu0
    calls1, usec1 = evalsha_usec(r)
    records, seq = r.hlen(ks[0]), int(r.hget(ks[1], "seq") or 0)
    r.unlink(*ks)
    want = 1 if packing == "flat-nowrite" else distinct
    ok = records == want and seq == n and calls1 - calls0 == len(batches)
    us = 1e6 / n
    return {"packing": packing, "batch": batch, "calls": len(batches),
            "build_us": build_s * us, "client_cpu_us": pcpu * us,
            "server_us": (usec1 - usec0) / n, "redis_cpu_us": rcpu * us,
            "e2e_us": e2e * us, "msg_s": n / e2e, "seconds": e2e,
            "verify": {"ok": ok, "records": records, "seq": seq,
                       "expected_records": distinct, "expected_seq": n}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000, help="upserts per run")
    ap.add_argument("--keys", type=int, default=50_000, help="distinct SOW keys")
    ap.add_argument("--size", type=int, default=200, help="approximate message bytes")
    ap.add_argument("--batches", default="100,500,2000", help="ops per script call")
    ap.add_argument("--packings", default="flat,msgpack,msgpack-flat",
                    help=f"variants to run, of {', '.join(SCRIPTS)}")
    ap.add_argument("--repeat", type=int, default=3, help="runs per variant (best shown)")
    ap.add_argument("--json", default="bench-results/bench_packing.json")
    a = ap.parse_args(argv)
    sizes = [int(x) for x in a.batches.split(",") if x]
    packings = [p for p in a.packings.split(",") if p]
    if any(p not in SCRIPTS for p in packings) or not sizes or min(sizes) < 1 or a.n < 1:
        ap.error(f"--packings from {sorted(SCRIPTS)}; --batches, --n positive")
    msgs = make_messages(a.n, a.keys, a.size)
    ops = make_ops(msgs, a.keys)
    distinct = min(a.n, a.keys)
    try:
        with private_redis("sow-pack-") as server:
            r = Redis.from_url(server.url)
            shas = {p: r.script_load(SCRIPTS[p]) for p in packings}
            version = r.info("server")["redis_version"]
            console.print(f"redis-server {version} on {server.url}; {a.n:,} upserts of "
                          f"~{sum(map(len, msgs)) / len(msgs):.0f} B")
            runs: list[dict[str, Any]] = []
            for rep in range(a.repeat):
                for batch in sizes:
                    for p in packings:
                        x = run(r, shas[p], p, ops, batch, distinct)
                        if not x["verify"]["ok"]:
                            raise BenchError(f"{p} batch {batch}: check failed: {x['verify']}")
                        runs.append(x)
                console.print(f"run {rep + 1} of {a.repeat} done")
            best = {}
            for x in runs:
                k = (x["batch"], x["packing"])
                if k not in best or x["e2e_us"] < best[k]["e2e_us"]:
                    best[k] = x
            table = Table(title=f"apply.lua argument packing: {a.n:,} upserts, best of {a.repeat}")
            for col in ("batch", "packing", "build µs", "client CPU µs", "server µs",
                        "redis CPU µs", "e2e µs", "msg/s", "vs flat"):
                table.add_column(col, justify="left" if col == "packing" else "right")
            rows = []
            for batch in sizes:
                flat = best.get((batch, "flat"))
                for p in packings:
                    x = best[(batch, p)]
                    vs = f"{flat['e2e_us'] / x['e2e_us']:.2f}x" if flat else "-"
                    table.add_row(str(batch), p, f"{x['build_us']:.2f}",
                                  f"{x['client_cpu_us']:.2f}", f"{x['server_us']:.2f}",
                                  f"{x['redis_cpu_us']:.2f}",
                                  f"{x['e2e_us']:.2f}", f"{x['msg_s']:,.0f}", vs)
                    rows.append({**x, "speedup_vs_flat": flat["e2e_us"] / x["e2e_us"] if flat
                                 else None})
            console.print(table)
            result = {
                "benchmark": "bench_packing",
                "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": {"cpu_count": os.cpu_count(), "redis_server": version,
                            "python": platform.python_version(), "msgpack": msgpack.version},
                "options": vars(a), "best": rows, "runs": runs, "verified": True,
            }
            console.print(f"results written to {write_json(a.json, result)}")
            return 0
    except BenchError as exc:
        console.print(f"[red]error:[/red] {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
