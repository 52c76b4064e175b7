#!/usr/bin/env python3
"""Floors for the storage figures: what one durable write costs each medium, one at a time.

  floors.py fsync --file F --count N        100-byte write + fdatasync into a preallocated file
  floors.py put --endpoint URL --bucket B --count N [--size BYTES]   one PutObject (boto3)
  floors.py pgbench-log FILE...             percentiles of pgbench --log files (latency column)
  floors.py pcap FILE --pg-port P [--http-port H]   where the time goes, from a loopback capture

Each prints one JSON object: count, p50_ms, p99_ms, mean_ms (pcap: one such object per leg).

Sequential on purpose: an append from one sequential client waits for exactly one such write,
so this is its lower bound.
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


def pcap_packets(path):
    """(time, source port, destination port, first payload bytes) of each TCP segment with a
    payload in a classic pcap file of IPv4 on loopback (tcpdump -i lo -w)."""
    import struct

    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) < 24:
            return
        magic, = struct.unpack("<I", head[:4])
        scale = 1e9 if magic == 0xA1B23C4D else 1e6
        link, = struct.unpack("<I", head[20:24])
        skip = {1: 14, 113: 16}.get(link, 0)  # Ethernet (lo), Linux cooked
        while True:
            rec = f.read(16)
            if len(rec) < 16:
                return
            sec, frac, incl, _ = struct.unpack("<IIII", rec)
            ip = f.read(incl)[skip:]
            if len(ip) < 20 or ip[0] >> 4 != 4 or ip[9] != 6:
                continue
            total, = struct.unpack(">H", ip[2:4])
            tcp = ip[(ip[0] & 15) * 4:total]
            sport, dport = struct.unpack(">HH", tcp[:4])
            payload = tcp[(tcp[12] >> 4) * 4:]
            if payload:
                yield sec + frac / scale, sport, dport, payload


def pcap_legs(a):
    """With --http-port (a node with the WAL in Postgres, one sequential client): per append,
    request in -> WAL statement sent -> Postgres's answer -> response out. The WAL's
    connection is the one that sends Bind ('B') most; the node's other Postgres connections
    (metadata log, catalog) are counted. Without it (pgbench): request -> first answer, per
    connection. The floor's TLS (pgbench prefers it) is opaque but timed alike."""
    from collections import Counter

    pk = list(pcap_packets(a.file))
    legs = {}

    def add(leg, dt):
        legs.setdefault(leg, []).append(dt * 1000)

    if a.http_port is None:
        sent = {}
        for ts, sp, dp, _ in pk:
            if dp == a.pg_port:
                sent.setdefault(sp, ts)
            elif sp == a.pg_port and dp in sent:
                add("postgres: statement -> answer", ts - sent.pop(dp))
        return {k: summary(v) for k, v in legs.items()}
    binds = Counter(sp for _, sp, dp, pl in pk if dp == a.pg_port and pl[:1] == b"B")
    if not binds:
        raise SystemExit("no WAL statements in the capture")
    wal = binds.most_common(1)[0][0]
    others = Counter()
    st = None
    for ts, sp, dp, _ in pk:
        if dp == a.http_port:
            if st is None or "resp" in st:
                st = {"req": ts}
        elif st is None:
            continue
        elif (sp, dp) == (wal, a.pg_port) and "sent" not in st:
            st["sent"] = ts
        elif (sp, dp) == (a.pg_port, wal) and "sent" in st and "answer" not in st:
            st["answer"] = ts
        elif sp == a.http_port and "answer" in st and "resp" not in st:
            st["resp"] = ts
            add("node in: request -> statement sent", st["sent"] - st["req"])
            add("postgres: statement -> answer", st["answer"] - st["sent"])
            add("node out: answer -> response sent", st["resp"] - st["answer"])
            add("node: request -> response", st["resp"] - st["req"])
        if a.pg_port in (sp, dp) and wal not in (sp, dp):
            others[dp if sp == a.pg_port else sp] += 1
    out = {k: summary(v) for k, v in legs.items()}
    out["other_postgres_segments"] = sum(others.values())
    return out


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
    c = sub.add_parser("pcap")
    c.add_argument("file")
    c.add_argument("--pg-port", type=int, default=5432)
    c.add_argument("--http-port", type=int)
    a = ap.parse_args()
    r = {"fsync": fsync_floor, "put": put_floor, "pgbench-log": pgbench_log, "pcap": pcap_legs}[
        a.cmd
    ](a)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
