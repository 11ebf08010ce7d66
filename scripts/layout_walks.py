"""Walks through the package: which files a publish and a live event pass through (issue 24).

Two walks, traced with :func:`sys.setprofile` / :func:`threading.setprofile` over the calls into
the package's own source files (library code is not counted):

* **publish**: ``sow-redis publish -t T`` of one message, in this process, from the CLI's entry
  point until the command returns (the write-through apply writes the record in the same call);
* **live event**: ``sow-redis subscribe -t T`` running in a thread; from the moment a message is
  published by another client until the subscriber has printed its line.

For each walk it prints the files visited (distinct source files with at least one call) and
the back-and-forth steps (how often one call is in another file than the call before it).
Only the ``sow_redis.cli:main`` entry point is used, so a checkout from before a change can be
walked with the same script::

    python scripts/layout_walks.py [--root PATH] [--json OUT]

``--root`` is the checkout whose package is imported (default: this one). A redis-server from
PATH is started on a free loopback port and stopped at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Walk:
    """Source files of the package's calls, in order, while :attr:`on` is set."""

    def __init__(self, package_dir: Path, thread: str | None = None) -> None:
        self.package_dir = str(package_dir)
        self.thread = thread
        self.on = False
        self.files: list[str] = []

    def profile(self, frame: Any, event: str, arg: Any) -> None:
        """The profile hook: record a call into a package file."""
        if not self.on or event != "call":
            return
        if self.thread is not None and threading.current_thread().name != self.thread:
            return
        name = frame.f_code.co_filename
        if name.startswith(self.package_dir):
            self.files.append(name[len(self.package_dir) + 1:])

    def figures(self) -> dict[str, Any]:
        """Files visited and back-and-forth steps of the walk."""
        steps = sum(1 for a, b in zip(self.files, self.files[1:]) if a != b)
        order: list[str] = []
        for f in self.files:
            if f not in order:
                order.append(f)
        return {"files_visited": len(order), "back_and_forth_steps": steps,
                "calls": len(self.files), "files": order}


def run(root: Path) -> dict[str, Any]:
    """Start a redis-server, define a topic, and walk a publish and a live event."""
    sys.path.insert(0, str(root))
    from sow_redis.cli import main

    port = free_port()
    data = Path(tempfile.mkdtemp())
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                               "--save", "", "--appendonly", "no", "--dir", str(data)],
                              stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    os.environ["SOW_REDIS_URL"] = url
    os.environ.pop("SOW_CONTROL_URL", None)
    topic = f"walk_{uuid.uuid4().hex[:8]}"
    cfg = data / "walk.toml"
    cfg.write_text(f'[[topic]]\nname = "{topic}"\nkey = ["/id"]\npartitions = 2\n')

    def cli(*args: str, stdin: bytes = b"") -> None:
        old_in = sys.stdin
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                main(list(args), standalone_mode=False)
        finally:
            sys.stdin = old_in

    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        cli("config", "apply", str(cfg))
        cli("publish", "-t", topic, stdin=b'{"id": 0, "v": "warm"}\n')  # imports, scripts

        package = root / "sow_redis"
        walk = Walk(package)
        sys.setprofile(walk.profile)
        walk.on = True
        cli("publish", "-t", topic, stdin=b'{"id": 1, "v": "first"}\n')
        walk.on = False
        sys.setprofile(None)
        publish = walk.figures()

        live = Walk(package, thread="MainThread")
        out = _Lines()
        result: dict[str, Any] = {"root": str(root), "publish": publish}

        def publish_one() -> None:  # in a thread: the subscriber needs the main thread
            time.sleep(2.0)  # subscribed and idle
            live.on = True
            before = out.count
            cli("publish", "-t", topic, stdin=b'{"id": 2, "v": "live"}\n')
            deadline = time.monotonic() + 20
            while out.count == before and time.monotonic() < deadline:
                time.sleep(0.01)
            live.on = False
            result["live_event"] = live.figures()
            result["live_event_printed"] = out.count > before
            done.set()

        done = threading.Event()
        threading.Thread(target=publish_one, name="publisher", daemon=True).start()
        sys.setprofile(live.profile)
        with contextlib.redirect_stdout(out):
            watcher = threading.Thread(target=_stop_when, args=(done,), daemon=True)
            watcher.start()
            with contextlib.suppress(KeyboardInterrupt, SystemExit):
                main(["subscribe", "-t", topic], standalone_mode=False)
        sys.setprofile(None)
        return result
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(data, ignore_errors=True)


def _stop_when(done: threading.Event) -> None:
    """Interrupt the subscriber in the main thread once the walk is recorded (SIGINT, as a
    user's Ctrl-C)."""
    done.wait(60)
    import signal

    os.kill(os.getpid(), signal.SIGINT)


class _Counter(io.BytesIO):
    """Bytes written to stdout, counting the lines (from any thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def write(self, b: Any) -> int:
        self.count += bytes(b).count(b"\n")
        return super().write(b)


class _Lines(io.TextIOWrapper):
    """A stdout with a ``buffer`` (the CLI writes bytes there) that counts its lines."""

    def __init__(self) -> None:
        self.counter = _Counter()
        super().__init__(self.counter, write_through=True)

    @property
    def count(self) -> int:
        return self.counter.count


def main() -> None:
    """Print both walks (and write them as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--files", action="store_true", help="list the files of each walk")
    args = parser.parse_args()
    result = run(args.root.resolve())
    for name in ("publish", "live_event"):
        w = result[name]
        print(f"{name:12} files visited {w['files_visited']:3}   back-and-forth steps "
              f"{w['back_and_forth_steps']:5}   calls {w['calls']:6}")
        if args.files:
            for f in w["files"]:
                print(f"    {f}")
    if not result["live_event_printed"]:
        print("live event: the subscriber printed nothing within 20 s", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    os._exit(0)  # the subscriber thread blocks in Redis; nothing else is left to do


if __name__ == "__main__":
    main()
