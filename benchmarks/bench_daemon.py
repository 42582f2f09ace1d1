"""Load benchmark of the kreg dispatch daemon (Unix socket, this machine only).

    .venv/bin/python benchmarks/bench_daemon.py [--clients 64] [--selects 500] [--rate 3000]

Phases, each with a bounded number of requests:

1. ``shared``: CLIENTS processes, each issuing SELECTS raw-API selects (``DaemonClient.select``)
   of distinct workloads (so a client-side cache would miss every time), the same workload set
   across clients in a per-client shuffled order: the daemon's shared cache answers all but the
   first asker of each key. Paced at an aggregate RATE (open loop, each client on its own
   schedule), as ranks ask on their cache misses; latency = send to parsed reply.
2. ``distinct``: as 1, but every request of every client is a different workload: every one is a
   daemon miss (a full selection in the daemon).
3. ``saturation``: as 1, closed loop (no pacing): throughput, and latency = clients / throughput
   (Little's law), reported to show where the paced numbers stand.
4. ``kill -9``: CLIENTS processes selecting through ``registry.select`` with KREG_DAEMON set
   (distinct workloads); the daemon is killed with SIGKILL mid-run and restarted. Counts failed
   selections (must be 0), in-process fallbacks, and when each client was back on the daemon.
5. ``abuse``: 1,000 malformed, oversized, cut-off, wrong-version and unknown-type frames (a new
   connection each); the daemon must still answer, RSS reported before and after.

Prints a table; ``--json PATH`` also writes the numbers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))

OP = "sparse_prefill"
DEVICE = "rtx-pro-6000-blackwell-server"


def _workload(n: int) -> dict[str, Any]:
    """Workload number n (n >= 0): distinct n give distinct workloads."""
    return {"kind": "chunk", "topk": 2051, "head_dim": 256, "group_size": 6, "num_kv_heads": 1,
            "total_q": n + 1, "num_requests": 1, "max_q": n + 1, "dtype": "bfloat16"}


_IMPL = b'"implementation":"'


def _raw_client(args: tuple[Any, ...]) -> dict[str, Any]:
    path, idx, selects, interval, distinct, barrier = args
    from registry import get_registry, profiles
    from registry.daemon.client import DaemonClient

    facts_model = profiles()[DEVICE]
    facts, facts_fp = facts_model.model_dump_json(), facts_model.fingerprint
    fp = get_registry().plugin_fingerprint()
    order = [idx * selects + i if distinct else i for i in range(selects)]
    random.Random(idx).shuffle(order)
    client = DaemonClient(path, timeout=5.0)
    client.connect()
    lat: list[float] = []
    errors = hits = 0
    barrier.wait(60)
    began = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
    start = time.perf_counter() + random.Random(-idx).random() * interval
    for i, n in enumerate(order):
        if interval:
            delay = start + i * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        t0 = time.perf_counter()
        try:
            reply = client.select(OP, facts, _workload(n), None, fp, facts_fp)
            # The raw API hands back the Decision's JSON unparsed; check it names a kernel.
            ok = bool(reply["ok"] and _IMPL in reply["attachment"])
        except Exception:
            ok = False
            client.close()
        lat.append(time.perf_counter() - t0)
        if ok:
            hits += bool(reply.get("hit"))
        else:
            errors += 1
    client.close()
    return {"lat": lat, "errors": errors, "hits": hits, "began": began, "ended": time.monotonic()}


def _registry_client(args: tuple[Any, ...]) -> dict[str, Any]:
    path, idx, selects, interval, barrier = args
    os.environ["KREG_DAEMON"] = path
    import registry

    facts = registry.profiles()[DEVICE]
    registry.get_registry()  # load the plugins before the clock starts
    events: list[tuple[float, str]] = []
    failed = 0
    barrier.wait(60)
    start = time.perf_counter()
    for i in range(selects):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        try:
            d = registry.select(OP, _workload(1_000_000 + idx * selects + i), facts)
            events.append((time.time(), d.source))
        except Exception as exc:
            failed += 1
            events.append((time.time(), f"error {type(exc).__name__}"))
    return {"events": events, "failed": failed}


def _worker(target: Any, args: tuple[Any, ...], queue: Any) -> None:
    queue.put(target(args))


def _fan_out(target: Any, arglist: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Run target(args) in one forked process each; their results (bounded wait)."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(target, a, queue)) for a in arglist]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    return results


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def _run_raw(path: str, clients: int, selects: int, rate: float, distinct: bool) -> dict[str, Any]:
    from registry.daemon.cli import daemon_stats

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(clients)
    interval = clients / rate if rate else 0.0
    before = daemon_stats(Path(path), 5.0) or {}
    results = _fan_out(_raw_client, [(path, i, selects, interval, distinct, barrier)
                                     for i in range(clients)])
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    after = daemon_stats(Path(path), 5.0) or {}
    lat = [x for r in results for x in r["lat"]]
    return {"requests": len(lat), "errors": sum(r["errors"] for r in results),
            "p50_us": _pct(lat, 0.50) * 1e6, "p99_us": _pct(lat, 0.99) * 1e6,
            "max_us": max(lat) * 1e6, "mean_us": statistics.fmean(lat) * 1e6,
            "throughput": len(lat) / wall, "wall_s": wall,
            "daemon_hits": after.get("hits", 0) - before.get("hits", 0),
            "daemon_misses": after.get("misses", 0) - before.get("misses", 0),
            "rss_after": after.get("rss_bytes", 0), "loadavg": os.getloadavg()[0],
            # The daemon's own CPU per request: what it costs, whatever the neighbours do.
            "daemon_cpu_us": (after.get("cpu_s", 0) - before.get("cpu_s", 0)) / len(lat) * 1e6}


def _run_kill(path: str, clients: int, selects: int, rate: float) -> dict[str, Any]:
    from registry.daemon.cli import spawn_daemon

    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(clients + 1)
    interval = clients / rate
    duration = selects * interval
    from registry.daemon.server import read_pid

    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(_registry_client,
                                               (path, i, selects, interval, barrier), queue))
             for i in range(clients)]
    for p in procs:
        p.start()
    barrier.wait(60)
    time.sleep(duration * 0.3)
    pid = read_pid(Path(path))
    assert pid is not None
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    new_pid = spawn_daemon(Path(path))
    restarted_at = time.time()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(60)
    events = [e for r in results for e in r["events"]]
    back = []
    for r in results:
        after = [t for t, s in r["events"] if t > restarted_at and s == "daemon"]
        back.append(after[0] - restarted_at if after else None)
    all_back = restarted_at + max((b for b in back if b is not None), default=0.0)
    return {"selects": len(events), "failed": sum(r["failed"] for r in results),
            "from_daemon": sum(1 for _, s in events if s == "daemon"),
            "in_process": sum(1 for _, s in events if s == "local"),
            "downtime_s": restarted_at - killed_at, "old_pid": pid, "new_pid": new_pid,
            "clients_back": sum(1 for b in back if b is not None),
            "back_after_max_s": max((b for b in back if b is not None), default=None),
            "tail_from_daemon": sum(1 for t, s in events if t > all_back and s == "daemon"),
            "tail_total": sum(1 for t, _ in events if t > all_back)}


def _abuse(path: str, frames: int) -> dict[str, Any]:
    from registry.daemon.client import DaemonClient

    with DaemonClient(path, 5.0) as c:
        before = c.stats()
    rng = random.Random(0)
    kinds = ["bad_json", "not_object", "oversized", "cut", "bad_version", "unknown_type",
             "garbage", "huge_ok_size_cut"]
    sent = dict.fromkeys(kinds, 0)
    for i in range(frames):
        kind = kinds[i % len(kinds)]
        sent[kind] += 1
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(path)
        if kind == "bad_json":
            body = b"{not json" + bytes(rng.randrange(256) for _ in range(20))
            s.sendall(struct.pack(">I", len(body)) + body)
        elif kind == "not_object":
            body = b"[1,2,3]"
            s.sendall(struct.pack(">I", len(body)) + body)
        elif kind == "oversized":
            s.sendall(struct.pack(">I", 1 << 30) + b"x" * 1024)
        elif kind == "cut":
            body = json.dumps({"v": 1, "id": 1, "type": "stats"}).encode()
            s.sendall(struct.pack(">I", len(body)) + body[: len(body) // 2])
        elif kind == "bad_version":
            body = json.dumps({"v": 99, "id": 1, "type": "stats"}).encode()
            s.sendall(struct.pack(">I", len(body)) + body)
        elif kind == "unknown_type":
            body = json.dumps({"v": 1, "id": 1, "type": "launch_missiles"}).encode()
            s.sendall(struct.pack(">I", len(body)) + body)
        elif kind == "garbage":
            s.sendall(bytes(rng.randrange(256) for _ in range(rng.randrange(1, 64))))
        else:  # announces 60 KiB (allowed), sends 30 KiB, hangs up
            s.sendall(struct.pack(">I", 60 * 1024) + b"{" * (30 * 1024))
        if kind in ("bad_json", "not_object", "bad_version", "unknown_type", "oversized"):
            with contextlib.suppress(OSError):
                s.recv(4096)  # the error reply (or the close)
        s.close()
    time.sleep(0.5)
    with DaemonClient(path, 5.0) as c:
        after = c.stats()
        from registry import get_registry, profiles

        reply = c.select(OP, profiles()[DEVICE].model_dump_json(), _workload(7), None,
                         get_registry().plugin_fingerprint())
    return {"frames": frames, "sent": sent, "rss_before": before["rss_bytes"],
            "rss_after": after["rss_bytes"], "errors": after["errors"],
            "still_answers": bool(reply["ok"]
                                  and json.loads(reply["attachment"])["implementation"]),
            "open_connections": after["connections_open"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--selects", type=int, default=500)
    parser.add_argument("--rate", type=float, default=3000.0,
                        help="aggregate offered selects per second in the paced phases")
    parser.add_argument("--abuse", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--skip", default="", help="comma-separated phases to skip")
    args = parser.parse_args()
    skip = set(args.skip.split(","))

    home = Path(tempfile.mkdtemp(prefix="kreg-bench-"))
    os.environ["KREG_HOME"] = str(home)
    os.environ.pop("KREG_DAEMON", None)
    path = str(home / "d.sock")
    from registry.daemon.cli import spawn_daemon, stop_daemon

    spawn_daemon(Path(path))
    out: dict[str, Any] = {"clients": args.clients, "selects": args.selects, "rate": args.rate,
                           "cpus": os.cpu_count(), "loadavg_before": os.getloadavg()[0]}
    try:
        if "shared" not in skip:
            out["shared"] = _run_raw(path, args.clients, args.selects, args.rate, False)
        if "distinct" not in skip:
            out["distinct"] = _run_raw(path, args.clients, args.selects, args.rate, True)
        if "saturation" not in skip:
            out["saturation"] = _run_raw(path, args.clients, args.selects, 0.0, False)
        if "kill" not in skip:
            out["kill"] = _run_kill(path, args.clients, args.selects, args.rate)
        if "abuse" not in skip:
            out["abuse"] = _abuse(path, args.abuse)
    finally:
        stop_daemon(Path(path))
        shutil.rmtree(home, ignore_errors=True)
    out["loadavg_after"] = os.getloadavg()[0]
    _print(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    ok = all(out[p]["errors"] == 0 for p in ("shared", "distinct", "saturation") if p in out)
    ok &= out.get("kill", {}).get("failed", 0) == 0
    return 0 if ok else 1


def _print(out: dict[str, Any]) -> None:
    n, s = out["clients"], out["selects"]
    print(f"\nkreg daemon load benchmark: {n} clients x {s} selects, {out['cpus']} CPUs, "
          f"paced phases offered {out['rate']:.0f} selects/s in total; 1-min load average "
          f"{out['loadavg_before']:.1f} before, {out['loadavg_after']:.1f} after\n")
    print("| phase | requests | errors | p50 µs | p99 µs | max µs | selects/s | daemon hits "
          "| daemon misses | daemon CPU µs/select | load avg after |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in ("shared", "distinct", "saturation"):
        r = out.get(name)
        if r:
            print(f"| {name} | {r['requests']} | {r['errors']} | {r['p50_us']:.0f} | "
                  f"{r['p99_us']:.0f} | {r['max_us']:.0f} | {r['throughput']:.0f} | "
                  f"{r['daemon_hits']} | {r['daemon_misses']} | {r['daemon_cpu_us']:.0f} | "
                  f"{r['loadavg']:.1f} |")
    k = out.get("kill")
    if k:
        last = k["back_after_max_s"]
        print(f"\nkill -9 under load: {k['selects']} selects, {k['failed']} failed, "
              f"{k['from_daemon']} from the daemon, {k['in_process']} in-process fallbacks; "
              f"daemon down {k['downtime_s']:.2f} s (pid {k['old_pid']} -> {k['new_pid']}); "
              f"{k['clients_back']}/{n} clients back on the daemon, the last after "
              f"{'-' if last is None else format(last, '.2f')} s after the restart; from then on "
              f"{k['tail_from_daemon']}/{k['tail_total']} selects came from the daemon")
    a = out.get("abuse")
    if a:
        print(f"\nabuse: {a['frames']} bad frames {a['sent']}; daemon still answers: "
              f"{a['still_answers']}; RSS {a['rss_before'] / 2**20:.1f} MiB -> "
              f"{a['rss_after'] / 2**20:.1f} MiB; open connections after: "
              f"{a['open_connections']}; error counters {a['errors']}")


if __name__ == "__main__":
    sys.exit(main())
