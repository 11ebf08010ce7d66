#!/usr/bin/env python3
"""Sample real worker processes (and the publisher) with ``py-spy record`` during ingest.

Starts its own redis-server on a free loopback port (never 6379) and W ``sow-redis worker``
processes (as ``bench_ingest.py`` does), then runs two phases, each under ``py-spy record
--idle -f raw`` attached by pid to every worker and to this process (the publisher):

* ``backlog``: N entries appended to a topic the workers cannot see yet, then revealed and
  its jobs enqueued; ends when every partition is applied;
* ``live``: N entries appended (job markers set with each 1,000: ``append(jobs=...)``) while the workers apply;
  ends when every partition is applied.

Per phase it prints the seconds, msg/s, CPU seconds of redis-server, the workers and this
process, and writes the raw profiles to ``<out>/pyspy_<phase>_{worker<i>,publisher}.txt``
(summarise them with ``scripts/pyspy_summary.py``). The sample counts are wall-clock
(``--idle``): a worker waiting for a job or for Redis is sampled too.

Example::

    .venv/bin/python scripts/profile_live.py --n 200000 --workers 2
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from bench_ingest import make_messages, topic_config
from benchlib import Workers, applied_counts, private_redis, proc_cpu_s, redis_cpu_s, write_json
from redis import Redis

from sow_redis.apply.jobs import ensure_jobs
from sow_redis.publish.append import append, wait_applied
from sow_redis.registry import apply_topics
from sow_redis.settings import Settings

PY_SPY = str(Path(sys.executable).with_name("py-spy"))


class Spies:
    """One ``py-spy record`` per pid, stopped with SIGINT (py-spy then writes its file)."""

    def __init__(self, pids: dict[str, int], out: Path, phase: str, rate: int):
        self.procs = []
        for label, pid in pids.items():
            path = out / f"pyspy_{phase}_{label}.txt"
            self.procs.append(subprocess.Popen(
                [PY_SPY, "record", "--pid", str(pid), "--idle", "-f", "raw", "-r", str(rate),
                 "-o", str(path)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        time.sleep(1.0)  # py-spy attaches

    def stop(self) -> list[str]:
        errs = []
        for p in self.procs:
            p.send_signal(signal.SIGINT)
        for p in self.procs:
            try:
                _o, e = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                _o, e = p.communicate()
            if p.returncode not in (0, -2):
                errs.append(e.decode(errors="replace")[-500:])
        return errs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--keys", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=Settings.batch_size)
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--out", default="bench-results")
    a = ap.parse_args(argv)
    msgs = make_messages(a.n, a.keys, a.size)
    distinct = min(a.n, a.keys)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"options": vars(a)}
    with private_redis("sow-live-") as server:
        r = Redis.from_url(server.url)
        settings = Settings.from_env(redis_url=server.url, batch_size=a.batch_size)
        ws = Workers(server.url, a.workers, server.workdir, {"SOW_BATCH_SIZE": str(a.batch_size)})
        try:
            ws.start()
            ws.wait_registered(r)
            time.sleep(0.5)
            parts = list(range(a.partitions))
            pids = {f"worker{i}": p.pid for i, p in enumerate(ws.procs)}
            pids["publisher"] = os.getpid()
            redis_pid = server.proc.pid
            for phase in ("backlog", "live"):
                t = topic_config(f"live_{uuid.uuid4().hex[:8]}_{phase}", a.partitions)
                if phase == "backlog":
                    res = append(r, t, (("publish", m, None) for m in msgs))
                    spies = Spies(pids, out, phase, a.rate)
                    c0 = (redis_cpu_s(r), ws.cpu_s(), time.process_time(), proc_cpu_s(redis_pid))
                    t0 = time.perf_counter()
                    apply_topics(r, [t])
                    ensure_jobs(r, t.name, parts, settings)
                    t_pub = t0
                else:
                    apply_topics(r, [t])
                    spies = Spies(pids, out, phase, a.rate)
                    c0 = (redis_cpu_s(r), ws.cpu_s(), time.process_time(), proc_cpu_s(redis_pid))
                    t0 = time.perf_counter()
                    res = append(r, t, (("publish", m, None) for m in msgs),
                                 jobs=settings)
                    t_pub = time.perf_counter()
                wait_applied(r, t, res.last_ids, timeout_s=600, poll_s=0.005)
                t1 = time.perf_counter()
                cpu = {"redis_cpu_s": redis_cpu_s(r) - c0[0], "workers_cpu_s": ws.cpu_s() - c0[1],
                       "publisher_cpu_s": time.process_time() - c0[2]}
                errs = spies.stop()
                records, seq, errors = applied_counts(r, t)
                ok = records == distinct and seq == a.n and errors == 0
                result[phase] = {"seconds": t1 - t0, "msg_s": a.n / (t1 - t0),
                                 "publish_seconds": t_pub - t0, **cpu, "verified": ok,
                                 "py_spy_errors": errs}
                print(f"{phase}: {t1 - t0:.3f} s, {a.n / (t1 - t0):,.0f} msg/s "
                      f"(publish {t_pub - t0:.3f} s); CPU s: redis {cpu['redis_cpu_s']:.2f}, "
                      f"workers {cpu['workers_cpu_s']:.2f}, publisher "
                      f"{cpu['publisher_cpu_s']:.2f}; {'ok' if ok else 'VERIFY FAILED'}"
                      + (f"; py-spy: {errs}" if errs else ""))
            print(f"written: {write_json(str(out / 'profile_live.json'), result)}")
            return 0
        finally:
            ws.stop()


if __name__ == "__main__":
    sys.exit(main())
