"""A librdkafka producer load (confluent-kafka) for scripts/bench/kafka.sh: the same settings
against every broker, counted the way `pico bench` counts (docs/design/bench.md): a record
counts when its delivery report arrives inside the measured window, its latency is
librdkafka's own from produce() to the delivery report, errors are counted apart.

    kafka_produce.py create BOOTSTRAP TOPIC            # CreateTopics (1 partition) via the admin API
    kafka_produce.py run BOOTSTRAP TOPIC [options]     # prints one JSON report

Each of --producers processes runs one Producer (one connection to the leader). Its local
queue holds at most --batch x --in-flight records, so produce() blocks once the in-flight
window is full and the latency is that of the requests, not of a queue of seconds.
"""

import argparse
import json
import multiprocessing as mp
import sys
import time

from confluent_kafka import KafkaException, Producer, libversion
from confluent_kafka import version as _version
from confluent_kafka.admin import AdminClient, NewTopic


def version():
    v = _version()
    return v[0] if isinstance(v, tuple) else v


def create(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic]
    try:
        fut.result(timeout=30)
    except KafkaException as e:
        # TOPIC_ALREADY_EXISTS is fine: a re-run reuses it.
        if e.args[0].code() != 36:
            raise


def worker(args, start, out):
    conf = {
        "bootstrap.servers": args.bootstrap,
        "acks": "all",
        "enable.idempotence": False,
        "compression.type": "none",
        "linger.ms": args.linger_ms,
        "batch.num.messages": args.batch,
        "batch.size": args.batch * (args.record_size + 64),
        "max.in.flight.requests.per.connection": args.in_flight,
        "queue.buffering.max.messages": args.batch * args.in_flight,
        "request.timeout.ms": 30000,
        "message.timeout.ms": 60000,
    }
    p = Producer(conf)
    value = b"x" * args.record_size
    w0 = start + args.warmup
    w1 = w0 + args.duration
    st = {"acked": 0, "errors": 0, "first_error": None, "lat": []}

    def on_delivery(err, msg):
        t = time.monotonic()
        inside = w0 <= t < w1
        if err is not None:
            if inside:
                st["errors"] += 1
            if st["first_error"] is None:
                st["first_error"] = str(err)
            return
        if inside:
            st["acked"] += 1
            lat = msg.latency()
            if lat is not None:
                st["lat"].append(lat)

    while time.monotonic() < start:
        time.sleep(0.001)
    n = 0
    while time.monotonic() < w1:
        try:
            p.produce(args.topic, value, on_delivery=on_delivery)
        except BufferError:
            # The window is full: wait for delivery reports.
            p.poll(0.001)
            continue
        n += 1
        if n % 64 == 0:
            p.poll(0)
    # Records still unanswered at the end are not counted (as in pico bench).
    p.flush(5)
    out.put(st)


def run(args):
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start = time.monotonic() + 1.0  # every process connected and ready
    procs = [ctx.Process(target=worker, args=(args, start, out)) for _ in range(args.producers)]
    for pr in procs:
        pr.start()
    results = [out.get(timeout=args.warmup + args.duration + 120) for _ in procs]
    for pr in procs:
        pr.join(10)
    acked = sum(r["acked"] for r in results)
    errors = sum(r["errors"] for r in results)
    lat = sorted(x for r in results for x in r["lat"])

    def q(f):
        return lat[min(len(lat) - 1, int(f * len(lat)))] * 1000 if lat else None

    mib = acked * args.record_size / 1048576 / args.duration
    print(json.dumps({
        "tool": "confluent-kafka %s (librdkafka %s)" % (version(), libversion()[0]),
        "bootstrap": args.bootstrap,
        "producers": args.producers,
        "batch": args.batch,
        "record_size": args.record_size,
        "linger_ms": args.linger_ms,
        "in_flight": args.in_flight,
        "duration_secs": args.duration,
        "write": {
            "mib_per_sec": mib,
            "records_per_sec": acked / args.duration,
            "records": acked,
            "errors": errors,
        },
        "write_latency": {"p50_ms": q(0.50), "p99_ms": q(0.99), "max_ms": lat[-1] * 1000 if lat else None},
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
    }, indent=1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["create", "run"])
    ap.add_argument("bootstrap")
    ap.add_argument("topic")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64, help="records per produce request")
    ap.add_argument("--linger-ms", type=float, default=5)
    ap.add_argument("--in-flight", type=int, default=5)
    ap.add_argument("--duration", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=2)
    args = ap.parse_args()
    if args.cmd == "create":
        create(args.bootstrap, args.topic)
    else:
        run(args)


if __name__ == "__main__":
    sys.exit(main())
