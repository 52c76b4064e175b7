#!/usr/bin/env python3
"""The disk's sync latency at a fixed rate: a 100-byte write then `fdatasync`, N times a second.

This is what one durable append costs the device when appends arrive at that rate (the SSE rows
append at 10 and 100 per second; compare.sh runs this right after PicoMQ's SSE rows). The file
is preallocated with zeros and synced first, so each write overwrites blocks already on disk, as
PicoMQ's WAL does in its preallocated segments.
A virtual disk can stall a single sync for hundreds of milliseconds; the writes due meanwhile
wait behind it, so at 10 appends/s one such stall is the p99 of a 10-second run, for any server
that delivers only durable data.
Prints one JSON object: rate, count, p50_ms, p90_ms, p99_ms, max_ms, over_20ms.
"""
import argparse
import json
import os
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, required=True, help="syncs per second")
    ap.add_argument("--duration", type=float, required=True, help="seconds")
    ap.add_argument("--file", required=True, help="scratch file (deleted at the end)")
    a = ap.parse_args()
    if a.rate <= 0 or a.duration <= 0:
        ap.error("--rate and --duration must be positive")
    n_max = int(a.rate * a.duration)
    if n_max < 1:
        ap.error("--rate × --duration must allow at least one write")
    record = b"x" * 100
    fd = os.open(a.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    lat = []
    try:
        os.write(fd, bytes(max(1 << 20, 100 * n_max)))
        os.fsync(fd)
        start = time.monotonic()
        for i in range(n_max):
            # Paced from the start time, and timed as `pico bench --target-mibps` times an
            # append: from the scheduled time when behind it (a stalled sync delays the writes
            # due during it, as it delays the appends queued behind it), else from waking.
            due = start + i / a.rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            t = time.monotonic() if delay > 0 else due
            os.pwrite(fd, record, i * len(record))
            os.fdatasync(fd)
            lat.append((time.monotonic() - t) * 1000.0)
    finally:
        os.close(fd)
        os.unlink(a.file)
    s = sorted(lat)

    def pct(q):
        return round(s[min(len(s) - 1, int(q * len(s)))], 3)

    print(json.dumps({
        "rate": a.rate, "count": len(s), "p50_ms": pct(0.5), "p90_ms": pct(0.9),
        "p99_ms": pct(0.99), "max_ms": round(s[-1], 3), "over_20ms": sum(1 for x in s if x > 20),
    }))


if __name__ == "__main__":
    main()
