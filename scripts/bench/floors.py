#!/usr/bin/env python3
"""Floors for the storage figures: what one durable write costs each medium, one at a time.

  floors.py fsync --file F --count N        100-byte write + fdatasync into a preallocated file
  floors.py put --endpoint URL --bucket B --count N [--size BYTES]   one PutObject (boto3)
  floors.py pgbench-log FILE...             percentiles of pgbench --log files (latency column)

Each prints one JSON object: count, p50_ms, p99_ms, mean_ms. Sequential on purpose: an append
from one sequential client waits for exactly one such write, so this is its lower bound.
"""
import argparse
import json
import os
import time


def summary(lat_ms):
    lat_ms = sorted(lat_ms)
    n = len(lat_ms)
    if n == 0:
        raise SystemExit("no samples")

    def pct(p):
        return lat_ms[min(n - 1, int(p * n))]

    return {
        "count": n,
        "p50_ms": round(pct(0.50), 3),
        "p99_ms": round(pct(0.99), 3),
        "mean_ms": round(sum(lat_ms) / n, 3),
    }


def fsync_floor(a):
    record = b"x" * 100
    size = 100 * a.count + 4096
    fd = os.open(a.file, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, b"\0" * size)
        os.fsync(fd)
        out = []
        for i in range(a.count):
            t = time.perf_counter()
            os.pwrite(fd, record, i * 100)
            os.fdatasync(fd)
            out.append((time.perf_counter() - t) * 1000)
    finally:
        os.close(fd)
        os.unlink(a.file)
    return summary(out)


def put_floor(a):
    import boto3  # comes with moto's venv

    s3 = boto3.client(
        "s3",
        endpoint_url=a.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    try:
        s3.create_bucket(Bucket=a.bucket)
    except s3.exceptions.BucketAlreadyOwnedByYou:
        pass
    body = b"x" * a.size
    for i in range(20):  # warm the connection pool
        s3.put_object(Bucket=a.bucket, Key=f"floor/warm/{i}", Body=body)
    out = []
    for i in range(a.count):
        t = time.perf_counter()
        s3.put_object(Bucket=a.bucket, Key=f"floor/{i:08}", Body=body)
        out.append((time.perf_counter() - t) * 1000)
    return summary(out)


def pgbench_log(a):
    out = []
    for path in a.files:
        with open(path) as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 3:
                    out.append(int(cols[2]) / 1000)  # latency in µs
    return summary(out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fsync")
    f.add_argument("--file", required=True)
    f.add_argument("--count", type=int, default=500)
    p = sub.add_parser("put")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--size", type=int, default=256)
    g = sub.add_parser("pgbench-log")
    g.add_argument("files", nargs="+")
    a = ap.parse_args()
    r = {"fsync": fsync_floor, "put": put_floor, "pgbench-log": pgbench_log}[a.cmd](a)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
