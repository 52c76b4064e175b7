"""Kafka clients against a real `pico serve` (driven by scripts/kafka-e2e.sh).

  e2e.py PHASE BOOTSTRAP HTTP_URL

Phases: `before` (idempotent producer, a consumer group of 2 on a 4-partition topic that
rebalances when one member leaves, cross-protocol reads and appends, compressed batches of every
codec, kafka-python and aiokafka)
and `after` (run after a server restart: the group resumes from its committed offsets).
Prints `N passed, N failed`; exits non-zero on any failure.
"""

import asyncio
import base64
import json
import sys
import time
import urllib.request

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

PHASE, BOOT, HTTP = sys.argv[1], sys.argv[2], sys.argv[3]
GROUP_TOPIC, GROUP = "grp4", "grp"
PER_PARTITION = 500
RESULTS = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAILED'}: {name}{(' -- ' + detail) if detail and not ok else ''}", flush=True)


def deadline(seconds):
    end = time.monotonic() + seconds
    return lambda: time.monotonic() < end


def produce_idempotent(topic, start, count_per_partition, partitions):
    p = Producer({"bootstrap.servers": BOOT, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5})
    reports = []
    for i in range(count_per_partition):
        for part in range(partitions):
            n = start + i
            p.produce(topic, value=f"v-{part}-{n}".encode(), key=f"k{n}".encode(),
                      partition=part, headers=[("n", str(n).encode())],
                      on_delivery=lambda err, msg: reports.append((err, msg.partition(), msg.offset())))
        p.poll(0)
    left = p.flush(30)
    errors = [r for r in reports if r[0] is not None]
    check(f"idempotent producer acks=all delivered {count_per_partition * partitions} to {topic}",
          left == 0 and not errors and len(reports) == count_per_partition * partitions,
          f"left={left} errors={errors[:3]} reports={len(reports)}")
    for part in range(partitions):
        offs = sorted(o for e, p_, o in reports if p_ == part)
        want = list(range(start, start + count_per_partition))
        check(f"partition {part} offsets consecutive from {start}", offs == want,
              f"{offs[:5]}..{offs[-5:]}")


def consumer(name):
    return Consumer({"bootstrap.servers": BOOT, "group.id": GROUP, "client.id": name,
                     "enable.auto.commit": False, "auto.offset.reset": "earliest",
                     "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
                     "max.poll.interval.ms": 60000})


def poll_some(c, seen, name):
    msgs = c.consume(num_messages=200, timeout=0.2)
    got = 0
    for m in msgs:
        if m.error():
            raise KafkaException(m.error())
        seen.setdefault((m.partition(), m.offset()), m.value())
        got += 1
    if got:
        try:
            c.commit(asynchronous=False)
        except KafkaException as e:
            # A rebalance in between: the next poll rejoins, and the records are read again
            # by whoever owns them (at least once).
            print(f"note: {name} commit refused ({e}); continuing", flush=True)
    return got


def group_before():
    admin = AdminClient({"bootstrap.servers": BOOT})
    fut = admin.create_topics([NewTopic(GROUP_TOPIC, num_partitions=4, replication_factor=1)])
    try:
        fut[GROUP_TOPIC].result(15)
        check("CreateTopics with 4 partitions", True)
    except Exception as e:  # noqa: BLE001
        check("CreateTopics with 4 partitions", False, str(e))
    md = admin.list_topics(timeout=10)
    check("Metadata lists 4 partitions", len(md.topics[GROUP_TOPIC].partitions) == 4,
          str(md.topics.get(GROUP_TOPIC)))
    produce_idempotent(GROUP_TOPIC, 0, PER_PARTITION, 4)

    c1, c2 = consumer("c1"), consumer("c2")
    c1.subscribe([GROUP_TOPIC])
    c2.subscribe([GROUP_TOPIC])
    seen = {}
    by = {"c1": 0, "c2": 0}
    alive = deadline(60)
    # Both members take part until half the records are read.
    while alive() and len(seen) < 2 * PER_PARTITION:
        by["c1"] += poll_some(c1, seen, "c1")
        by["c2"] += poll_some(c2, seen, "c2")
    a1, a2 = c1.assignment(), c2.assignment()
    check("the group of 2 splits the 4 partitions", len(a1) == 2 and len(a2) == 2
          and {t.partition for t in a1} | {t.partition for t in a2} == {0, 1, 2, 3},
          f"c1={[t.partition for t in a1]} c2={[t.partition for t in a2]} by={by}")
    # c2 leaves: c1 is rebalanced onto all 4 partitions and reads everything left.
    c2.close()
    alive = deadline(60)
    while alive() and len(seen) < 4 * PER_PARTITION:
        poll_some(c1, seen, "c1")
    check("after one member leaves the other reads all 4 partitions",
          len(c1.assignment()) == 4, str([t.partition for t in c1.assignment()]))
    want = {(p, o): f"v-{p}-{o}".encode() for p in range(4) for o in range(PER_PARTITION)}
    check("every record consumed once by the group, bytes equal", seen == want,
          f"have={len(seen)} want={len(want)}")
    committed = c1.committed([TopicPartition(GROUP_TOPIC, p) for p in range(4)], timeout=10)
    check("committed offsets at the end of each partition",
          [t.offset for t in committed] == [PER_PARTITION] * 4, str(committed))
    c1.close()


def group_after():
    produce_idempotent(GROUP_TOPIC, PER_PARTITION, 100, 4)
    c = consumer("c3")
    c.subscribe([GROUP_TOPIC])
    seen = {}
    alive = deadline(60)
    while alive() and len(seen) < 400:
        poll_some(c, seen, "c3")
    time.sleep(1)
    poll_some(c, seen, "c3")
    want = {(p, o): f"v-{p}-{o}".encode() for p in range(4)
            for o in range(PER_PARTITION, PER_PARTITION + 100)}
    check("after a restart the group resumes from its committed offsets", seen == want,
          f"have={len(seen)} first={sorted(seen)[:3]}")
    c.close()


def http_get(path):
    with urllib.request.urlopen(f"{HTTP}{path}", timeout=10) as r:
        return json.loads(r.read())


def http_post(path, body, headers):
    req = urllib.request.Request(f"{HTTP}{path}", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, dict(r.headers)


def body_of(rec):
    if "body_b64" in rec:
        return base64.b64decode(rec["body_b64"])
    return rec["body"].encode()


def cross_protocol():
    admin = AdminClient({"bootstrap.servers": BOOT})
    admin.create_topics([NewTopic("xp", num_partitions=2, replication_factor=1)])["xp"].result(15)
    p = Producer({"bootstrap.servers": BOOT, "acks": "all"})
    sent = []
    for i in range(50):
        value = bytes([i % 256]) * (i + 1) if i % 2 else f"text-{i}".encode()
        p.produce("xp", value=value, key=f"key-{i}".encode(), partition=1,
                  headers=[("h", f"hv-{i}".encode())])
        sent.append(value)
    p.flush(30)
    recs = http_get("/xp/~1?seq=0&count=100&format=json")
    check("produced over Kafka, read over HTTP at the same offsets",
          [r["seq"] for r in recs] == list(range(50)), str([r["seq"] for r in recs][:5]))
    check("same bodies over HTTP", [body_of(r) for r in recs] == sent)
    check("same keys over HTTP", [r.get("key") for r in recs] == [f"key-{i}" for i in range(50)],
          str(recs[0]))
    check("same headers over HTTP", all(r.get("headers", {}).get("h") == f"hv-{i}"
                                       for i, r in enumerate(recs)), str(recs[0].get("headers")))

    status, headers = http_post("/xp", b"over-http", {"Pico-Key": "hk"})
    batch = json.dumps({"records": [{"body": "b1", "headers": {"x": "1"}},
                                    {"body": "b2", "headers": {"x": "2"}}]}).encode()
    http_post("/xp", batch, {"Content-Type": "application/vnd.picomq.batch+json"})
    c = Consumer({"bootstrap.servers": BOOT, "group.id": "xp-reader", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition("xp", 0, 0)])
    got = []
    alive = deadline(30)
    while alive() and len(got) < 3:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m)
    c.close()
    check("appended over HTTP, consumed over Kafka at the same offsets",
          [m.offset() for m in got] == [0, 1, 2], str([m.offset() for m in got]))
    check("same bodies over Kafka", [m.value() for m in got] == [b"over-http", b"b1", b"b2"])
    check("same key over Kafka", got and got[0].key() == b"hk")
    check("same headers over Kafka", [dict(m.headers() or []) for m in got[1:]] ==
          [{"x": b"1"}, {"x": b"2"}], str([m.headers() for m in got]))


def compressed():
    """librdkafka producers with each compression.type: the batches are stored as sent, consumed
    back over Kafka and read over HTTP (which inflates them) at the same offsets."""
    for codec in ("gzip", "snappy", "lz4", "zstd"):
        topic = f"z-{codec}"
        p = Producer({"bootstrap.servers": BOOT, "acks": "all", "compression.type": codec,
                      "linger.ms": 20, "enable.idempotence": True})
        sent = [f"{codec} record {i} ".encode() * (1 + i % 7) for i in range(300)]
        errors = []
        for i, v in enumerate(sent):
            p.produce(topic, value=v, key=f"k{i}".encode(), headers=[("i", str(i).encode())],
                      on_delivery=lambda err, msg: err and errors.append(err))
            p.poll(0)
        left = p.flush(30)
        check(f"{codec} producer delivered {len(sent)}", left == 0 and not errors,
              f"left={left} errors={errors[:3]}")
        c = Consumer({"bootstrap.servers": BOOT, "group.id": f"z-{codec}-reader",
                      "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        got = []
        alive = deadline(30)
        while alive() and len(got) < len(sent):
            m = c.poll(0.5)
            if m is not None and not m.error():
                got.append(m)
        c.close()
        check(f"{codec} batches consumed back over Kafka",
              [m.value() for m in got] == sent and [m.offset() for m in got] == list(range(len(sent))),
              f"{len(got)} back")
        recs = http_get(f"/{topic}?seq=0&count=1000&format=json")
        check(f"{codec} batches read over HTTP at the same offsets",
              [r["seq"] for r in recs] == list(range(len(sent))) and
              [body_of(r) for r in recs] == sent and
              [r.get("key") for r in recs] == [f"k{i}" for i in range(len(sent))],
              f"{len(recs)} records")


def kafka_python():
    from kafka import KafkaConsumer, KafkaProducer
    p = KafkaProducer(bootstrap_servers=BOOT, acks="all")
    for i in range(100):
        p.send("kp", value=f"kp-{i}".encode(), key=b"k")
    p.flush(30)
    p.close()
    c = KafkaConsumer("kp", bootstrap_servers=BOOT, auto_offset_reset="earliest",
                      consumer_timeout_ms=5000, group_id=None)
    vals = [m.value for m in c]
    c.close()
    check("kafka-python produces and consumes", vals == [f"kp-{i}".encode() for i in range(100)],
          f"{len(vals)} {vals[:3]}")


async def aiokafka_roundtrip():
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    p = AIOKafkaProducer(bootstrap_servers=BOOT, acks="all")
    await p.start()
    try:
        for i in range(100):
            await p.send_and_wait("aio", f"aio-{i}".encode())
    finally:
        await p.stop()
    c = AIOKafkaConsumer("aio", bootstrap_servers=BOOT, auto_offset_reset="earliest")
    await c.start()
    vals = []
    try:
        end = time.monotonic() + 20
        while len(vals) < 100 and time.monotonic() < end:
            batch = await c.getmany(timeout_ms=500)
            for msgs in batch.values():
                vals.extend(m.value for m in msgs)
    finally:
        await c.stop()
    check("aiokafka produces and consumes", vals == [f"aio-{i}".encode() for i in range(100)],
          f"{len(vals)}")


def guarded(name, fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        check(name, False, repr(e))


if PHASE == "before":
    guarded("consumer group", group_before)
    guarded("cross protocol", cross_protocol)
    guarded("compressed batches", compressed)
    guarded("kafka-python", kafka_python)
    guarded("aiokafka", lambda: asyncio.run(aiokafka_roundtrip()))
else:
    guarded("resume after restart", group_after)

print(f"kafka-e2e {PHASE}: {RESULTS['passed']} passed, {RESULTS['failed']} failed", flush=True)
sys.exit(1 if RESULTS["failed"] else 0)
