#!/usr/bin/env python3
"""Floors for the storage figures: what one durable write costs each medium, one at a time.

  floors.py fsync --file F --count N        100-byte write + fdatasync into a preallocated file
  floors.py put --endpoint URL --bucket B --count N [--size BYTES] [--no-expect]
      [--if-none-match]   one PutObject (boto3; optionally without its Expect: 100-continue
      round trip, or conditional as the object WAL's)
  floors.py put-raw --endpoint URL --bucket B --count N   the same PUT from a raw socket, as
      the node sends it (one write, If-None-Match: *), without a client library's cost
  floors.py pgbench-log FILE...             percentiles of pgbench --log files (latency column)
  floors.py pcap FILE --pg-port P [--http-port H]   where the time goes, from a loopback capture
  floors.py pcap-s3 FILE --s3-port P [--http-port H --wal-bucket B]   the same, WAL on S3
  floors.py http --endpoint URL --stream NAME --count N   the node's own floor: one sequential
      keep-alive client alternating a 100-byte append (POST) with a HEAD of the same stream
  floors.py pg-stmts --db D [--port P] --count N [--gap-us G --gap sleep|busy] NAME=SQL...
      Postgres's answer time (statement sent -> ReadyForQuery) for several statements, one of
      each in turn on one connection, so a disk or CPU that changes speed slows each alike.
      NAME starting with "x": a prepared statement (Parse once, then Bind/Execute/Sync, as sqlx
      sends the node's); else a simple Query (as pgbench's default). {pos} in SQL: a position
      growing by one per statement ($1 when prepared). --gap-us idles (sleep) or spins (busy)
      before each statement, as the node's HTTP legs leave the backend idle between its own.

Each prints one JSON object: count, p50_ms, p99_ms, mean_ms (pcap, http: one such object per
leg or request kind).

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
    if a.no_expect:
        # boto3 sends `Expect: 100-continue` and waits for the interim answer before the body:
        # a round trip the node's PUT (headers and body at once) does not make.
        def drop_expect(params, **_):
            params.get("headers", {}).pop("Expect", None)

        s3.meta.events.register("before-call.s3.PutObject", drop_expect)
    extra = {"IfNoneMatch": "*"} if a.if_none_match else {}
    body = b"x" * a.size
    for i in range(20):  # warm the connection pool
        s3.put_object(Bucket=a.bucket, Key=f"floor/warm/{i}", Body=body)
    out, run = [], time.time_ns()
    for i in range(a.count):
        t = time.perf_counter()
        s3.put_object(Bucket=a.bucket, Key=f"floor/{run}/{i:08}", Body=body, **extra)
        out.append((time.perf_counter() - t) * 1000)
    return summary(out)


def put_raw_floor(a):
    """One PutObject as the node sends it, without a client library's own cost: a new
    connection (moto closes each), headers and body in one write, `If-None-Match: *` as the
    WAL's, timed from connect to the answer's status line. Unsigned: moto checks no signature.
    boto3's floor (`put`) adds its Python signing and checksum, and an `Expect: 100-continue`
    round trip, about 2 ms on moto."""
    import socket
    import urllib.parse

    u = urllib.parse.urlparse(a.endpoint)
    host, port = u.hostname, u.port or 80
    run = time.time_ns()

    def put(path, body, extra=""):
        t = time.perf_counter()
        s = socket.create_connection((host, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = (f"PUT /{a.bucket}{path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Length: {len(body)}\r\nx-amz-content-sha256: UNSIGNED-PAYLOAD\r\n"
                f"Authorization: AWS4-HMAC-SHA256 Credential=testing/20250101/us-east-1/s3/"
                f"aws4_request, SignedHeaders=host, Signature=00\r\n{extra}\r\n").encode()
        s.sendall(head + body)
        buf = b""
        while b"\r\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        dt = (time.perf_counter() - t) * 1000
        s.close()
        return int(buf.split()[1]), dt

    put("", b"")  # the bucket (200, or 409 if it exists)
    body, out = b"x" * a.size, []
    for i in range(20 + a.count):
        st, dt = put(f"/floor/raw/{run}/{i:08}", body, "If-None-Match: *\r\n")
        if st != 200:
            raise SystemExit(f"raw PUT answered {st}")
        if i >= 20:
            out.append(dt)
    return summary(out)


def pgbench_log(a):
    """The latency column; but pgbench 15 logs 0 µs for many fast transactions (its clock is
    read lazily, once per wake), which a commit round trip never takes. Then, as the client is
    sequential with no think time, each transaction's time is the gap between its completion
    stamp and the previous one (an upper bound: pgbench's own few µs are in it)."""
    out, gaps = [], []
    for path in a.files:
        prev = None
        with open(path) as f:
            for line in f:
                cols = line.split()
                if len(cols) >= 6:
                    out.append(int(cols[2]) / 1000)  # latency in µs
                    done = int(cols[4]) * 1_000_000 + int(cols[5])
                    if prev is not None:
                        gaps.append((done - prev) / 1000)
                    prev = done
    if gaps and min(out) <= 0:
        return dict(summary(gaps), source="completion gaps (latency column has zeros)")
    return summary(out)


def pcap_packets(path, syn=False):
    """(time, source port, destination port, first payload bytes) of each TCP segment with a
    payload in a classic pcap file of IPv4 on loopback (tcpdump -i lo -w); with `syn`, each
    connection's first SYN too, as a segment whose payload is b"SYN"."""
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
            if syn and tcp[13] & 0x12 == 0x02:  # SYN without ACK: a connection opened
                yield sec + frac / scale, sport, dport, b"SYN"
            elif payload:
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


def pcap_s3_legs(a):
    """A node with its WAL on S3, one sequential client: per append, request in -> the WAL
    entry's PUT (connection opened, request sent) -> the store's answer -> response out. The
    WAL's PUTs are told from the node's other requests to the same store (uploads, trims) by
    their path (`PUT /{bucket}/`, path style); a store that closes every connection (moto)
    has the node open one per PUT, so "node in" is split at the SYN."""
    pk = list(pcap_packets(a.file, syn=True))
    legs, st, syns, wal_conns, others = {}, None, {}, set(), 0
    put = f"PUT /{a.wal_bucket}/".encode()

    def add(leg, dt):
        legs.setdefault(leg, []).append(dt * 1000)

    for ts, sp, dp, pl in pk:
        if dp == a.s3_port and pl == b"SYN":
            syns[sp] = ts
            continue
        if dp == a.http_port:
            if st is None or "resp" in st:
                st = {"req": ts}
            continue
        if dp == a.s3_port and pl.startswith(put):
            wal_conns.add(sp)
            if st is not None and "sent" not in st:
                st["sent"], st["syn"] = ts, syns.get(sp)
            continue
        if sp == a.s3_port and dp in wal_conns:
            if st is not None and "sent" in st and "answer" not in st:
                st["answer"] = ts
            continue
        if a.s3_port in (sp, dp):
            others += 1
            if st is not None and "resp" not in st:
                st["busy"] = True
            continue
        if st is not None and sp == a.http_port and "answer" in st and "resp" not in st:
            st["resp"] = ts
            # Appends during which the node also talked to the store (uploads, trims) apart.
            add("appends alone: node: request -> response" if "busy" not in st
                else "appends beside other S3 requests: node: request -> response",
                ts - st["req"])
            add("appends alone: node in + node out" if "busy" not in st
                else "appends beside other S3 requests: node in + node out",
                (st["sent"] - st["req"]) + (ts - st["answer"]))
            if st["syn"] is not None and st["syn"] >= st["req"]:
                add("node in: request -> connect (SYN)", st["syn"] - st["req"])
                add("node in: connect (SYN) -> PUT sent", st["sent"] - st["syn"])
            add("node in: request -> PUT sent", st["sent"] - st["req"])
            add("s3: PUT sent -> answer", st["answer"] - st["sent"])
            if st["syn"] is not None and st["syn"] >= st["req"]:
                add("connect (SYN) -> answer", st["answer"] - st["syn"])
            add("node out: answer -> response sent", st["resp"] - st["answer"])
            add("node: request -> response", st["resp"] - st["req"])
    out = {k: summary(v) for k, v in legs.items()}
    out["other_s3_segments"] = others
    return out


def pcap_put_floor(a):
    """The floor's PUTs in a capture of its store's port: connection opened (SYN) -> PUT sent
    -> answer, per connection."""
    legs, syns, sent = {}, {}, {}
    for ts, sp, dp, pl in pcap_packets(a.file, syn=True):
        if dp == a.s3_port and pl == b"SYN":
            syns[sp] = ts
        elif dp == a.s3_port and pl.startswith(b"PUT ") and sp not in sent:
            sent[sp] = ts
            if sp in syns:
                legs.setdefault("connect (SYN) -> PUT sent", []).append((ts - syns[sp]) * 1000)
        elif sp == a.s3_port and dp in sent and sent[dp] is not None:
            # boto3 sends `Expect: 100-continue` and the body only after the interim answer:
            # a round trip more than the node's PUT, which sends headers and body at once.
            if pl.startswith(b"HTTP/1.1 100"):
                legs.setdefault("s3: PUT headers sent -> 100 Continue", []).append(
                    (ts - sent[dp]) * 1000)
                continue
            legs.setdefault("s3: PUT sent -> answer", []).append((ts - sent[dp]) * 1000)
            if dp in syns:
                legs.setdefault("connect (SYN) -> answer", []).append((ts - syns[dp]) * 1000)
            sent[dp] = None
    return {k: summary(v) for k, v in legs.items()}


def http_floor(a):
    """The node's own round trip next to an append's, from one client in the same run: a HEAD
    touches no WAL (no engine write, no Postgres), so it is what the machine and the node's
    HTTP path cost a request (the wake-ups of idle threads and CPUs included). Alternated with
    appends so both see the same machine; raw HTTP/1.1 on one socket, so the client's own cost
    is small and the same for both."""
    import socket
    import urllib.parse

    u = urllib.parse.urlparse(a.endpoint)
    s = socket.create_connection((u.hostname, u.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    host = f"{u.hostname}:{u.port}"
    path = "/" + a.stream
    body = b"x" * 100

    def req(method, payload=b""):
        head = f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: text/plain\r\n"
        if method != "HEAD":
            head += f"content-length: {len(payload)}\r\n"
        return head.encode() + b"\r\n" + payload

    buf = b""

    def answer(method):
        nonlocal buf
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit("connection closed")
            buf += chunk
        head, buf = buf.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                length = int(v)
        if method != "HEAD":
            while len(buf) < length:
                buf += s.recv(65536)
            buf = buf[length:]
        if status >= 300:
            raise SystemExit(f"{method} {path}: HTTP {status}")

    s.sendall(req("PUT"))
    answer("PUT")
    post, head = req("POST", body), req("HEAD")
    lat = {"append (POST)": [], "no WAL (HEAD)": []}
    deadline = time.monotonic() + a.seconds
    i = 0
    while time.monotonic() < deadline or i < 2 * a.count:
        kind, msg, method = (("append (POST)", post, "POST"), ("no WAL (HEAD)", head, "HEAD"))[i % 2]
        t = time.perf_counter()
        s.sendall(msg)
        answer(method)
        lat[kind].append((time.perf_counter() - t) * 1000)
        i += 1
    return {k: summary(v[a.count // 10:]) for k, v in lat.items()}


def pg_stmts(a):
    """Raw protocol (trust auth, no TLS), so the client's own cost is small and the same for
    every statement; prints p10 / p25 / p50 per statement (the low percentiles stay readable
    when other load makes the disk's flushes bimodal)."""
    import socket
    import struct

    s = socket.create_connection(("127.0.0.1", a.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""

    def msg(kind, body):
        return kind + struct.pack("!I", len(body) + 4) + body

    def ready():
        nonlocal buf
        while True:
            while len(buf) < 5 or len(buf) < 1 + struct.unpack("!I", buf[1:5])[0]:
                chunk = s.recv(65536)
                if not chunk:
                    raise SystemExit("connection closed")
                buf += chunk
            kind, n = buf[:1], struct.unpack("!I", buf[1:5])[0]
            body, buf = buf[5:1 + n], buf[1 + n:]
            if kind == b"E":
                raise SystemExit("postgres: " + body.decode(errors="replace"))
            if kind == b"Z":
                return

    start = b"user\0" + a.user.encode() + b"\0database\0" + a.db.encode() + b"\0\0"
    s.sendall(struct.pack("!I", len(start) + 8) + struct.pack("!I", 196608) + start)
    ready()
    stmts = [x.split("=", 1) for x in a.stmts]
    for name, sql in stmts:
        if name.startswith("x"):
            text = sql.replace("{pos}", "$1").encode()
            s.sendall(msg(b"P", name.encode() + b"\0" + text + b"\0\0\0") + msg(b"S", b""))
            ready()

    def request(name, sql, pos):
        if not name.startswith("x"):
            return msg(b"Q", sql.format(pos=pos).encode() + b"\0")
        if "{pos}" in sql:
            p = str(pos).encode()
            params = struct.pack("!HHI", 0, 1, len(p)) + p
        else:
            params = struct.pack("!HH", 0, 0)
        return (msg(b"B", b"\0" + name.encode() + b"\0" + params + b"\0\0")
                + msg(b"E", b"\0\0\0\0\0") + msg(b"S", b""))

    pos = time.time_ns() // 1000
    lat = {name: [] for name, _ in stmts}
    for _ in range(a.count):
        for name, sql in stmts:
            pos += 1
            m = request(name, sql, pos)
            if a.gap_us:
                if a.gap == "busy":
                    t0 = time.perf_counter()
                    while time.perf_counter() - t0 < a.gap_us / 1e6:
                        pass
                else:
                    time.sleep(a.gap_us / 1e6)
            t = time.perf_counter()
            s.sendall(m)
            ready()
            lat[name].append((time.perf_counter() - t) * 1e6)
    out = {}
    for name, v in lat.items():
        v = sorted(v[a.count // 10:])
        out[name] = {k: round(v[int(q * len(v))]) for k, q in (("p10_us", .1), ("p25_us", .25), ("p50_us", .5))}
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
    p.add_argument("--no-expect", action="store_true", help="without Expect: 100-continue")
    p.add_argument("--if-none-match", action="store_true", help="conditional, as the WAL's")
    pr = sub.add_parser("put-raw")
    pr.add_argument("--endpoint", required=True)
    pr.add_argument("--bucket", required=True)
    pr.add_argument("--count", type=int, default=500)
    pr.add_argument("--size", type=int, default=256)
    g = sub.add_parser("pgbench-log")
    g.add_argument("files", nargs="+")
    c = sub.add_parser("pcap")
    c.add_argument("file")
    c.add_argument("--pg-port", type=int, default=5432)
    c.add_argument("--http-port", type=int)
    s3 = sub.add_parser("pcap-s3")
    s3.add_argument("file")
    s3.add_argument("--s3-port", type=int, required=True)
    s3.add_argument("--http-port", type=int, help="the node's; without it: the floor's PUTs")
    s3.add_argument("--wal-bucket", default="wal-s3")
    h = sub.add_parser("http")
    h.add_argument("--endpoint", required=True)
    h.add_argument("--stream", required=True)
    h.add_argument("--count", type=int, default=1000, help="at least this many of each")
    h.add_argument("--seconds", type=float, default=0.0, help="and for at least this long")
    q = sub.add_parser("pg-stmts")
    q.add_argument("--db", required=True)
    q.add_argument("--user", default="postgres")
    q.add_argument("--port", type=int, default=5432)
    q.add_argument("--count", type=int, default=2000)
    q.add_argument("--gap-us", type=int, default=0)
    q.add_argument("--gap", choices=("sleep", "busy"), default="sleep")
    q.add_argument("stmts", nargs="+", metavar="NAME=SQL")
    a = ap.parse_args()
    r = {"fsync": fsync_floor, "put": put_floor, "put-raw": put_raw_floor, "pgbench-log": pgbench_log, "pcap": pcap_legs,
         "pcap-s3": lambda a: pcap_s3_legs(a) if a.http_port else pcap_put_floor(a),
         "http": http_floor, "pg-stmts": pg_stmts}[
        a.cmd
    ](a)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
