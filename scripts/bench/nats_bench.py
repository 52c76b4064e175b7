#!/usr/bin/env python3
"""Acknowledged JetStream publish benchmark (nats-py): throughput and ack latency.

`--in-flight` coroutines each publish one message and await its PubAck before the next, the
same shape as `pico bench --connections N -n 1` (one acknowledged append per request).
Prints one JSON object like `pico bench --output json` (write.* and write_latency.*).
The client is CPython: past ~10k msgs/s the client, not the server, is the limit (compare.sh
prints the client's CPU time next to the figure).
"""
import argparse
import asyncio
import json
import resource
import time

import nats
from nats.js.api import StorageType


def pct(sorted_s, q):
    if not sorted_s:
        return 0.0
    i = min(len(sorted_s) - 1, int(q * len(sorted_s)))
    return sorted_s[i] * 1000.0


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="nats://127.0.0.1:4222")
    ap.add_argument("--stream", default="BENCH")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--in-flight", type=int, default=64)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    a = ap.parse_args()

    nc = await nats.connect(a.url)
    js = nc.jetstream()
    subject = f"{a.stream.lower()}.x"
    try:
        await js.delete_stream(a.stream)
    except Exception:
        pass
    await js.add_stream(name=a.stream, subjects=[subject], storage=StorageType.FILE)
    payload = b"x" * a.size
    start = time.perf_counter()
    m0, m1 = start + a.warmup, start + a.warmup + a.duration
    lat = []
    errors = 0

    async def worker():
        nonlocal errors
        while True:
            t0 = time.perf_counter()
            if t0 >= m1:
                return
            try:
                await js.publish(subject, payload, timeout=10)
            except Exception:
                errors += 1
                continue
            t1 = time.perf_counter()
            if m0 <= t1 < m1:
                lat.append(t1 - t0)

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*[worker() for _ in range(a.in_flight)])
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    await nc.close()
    lat.sort()
    n = len(lat)
    out = {
        "client": "nats-py " + getattr(nats, "__version__", "2.x"),
        "in_flight": a.in_flight,
        "record_size": a.size,
        "duration_secs": a.duration,
        "client_cpu_secs": (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime),
        "write": {
            "records_per_sec": n / a.duration,
            "mib_per_sec": n * a.size / a.duration / 1048576,
            "records": n,
            "errors": errors,
        },
        "write_latency": {
            "p50_ms": pct(lat, 0.50),
            "p90_ms": pct(lat, 0.90),
            "p99_ms": pct(lat, 0.99),
            "p999_ms": pct(lat, 0.999),
            "max_ms": lat[-1] * 1000.0 if lat else 0.0,
        },
    }
    print(json.dumps(out))


asyncio.run(main())
