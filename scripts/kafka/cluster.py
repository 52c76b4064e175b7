"""A real Kafka client (confluent-kafka, librdkafka) against a two-node `pico serve` cluster
(driven by scripts/kafka-e2e.sh).

  cluster.py BOOT1 BOOT2 ADMIN1

Metadata from either node lists both brokers at their Kafka addresses. An idempotent producer
(acks=all) bootstrapped on node 1 writes a topic that node 1 owns; halfway through, the topic's
stream is transferred to node 2 (POST /admin/transfer on node 1's admin listener). Node 1 then
answers the producer NOT_LEADER_OR_FOLLOWER; the client refreshes Metadata, which names node 2
the leader, and carries on there: every message is delivered, once, at consecutive offsets,
and reads back in order through a consumer bootstrapped on node 2.
Prints `N passed, N failed`; exits non-zero on any failure.
"""

import json
import sys
import time
import urllib.request

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOT1, BOOT2, ADMIN1 = sys.argv[1], sys.argv[2], sys.argv[3]
TOPIC = "routed"
COUNT = 2000
RESULTS = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    RESULTS["passed" if ok else "failed"] += 1
    print(f"{'ok' if ok else 'FAILED'}: {name}{(' -- ' + detail) if detail and not ok else ''}", flush=True)


def brokers(boot):
    md = AdminClient({"bootstrap.servers": boot}).list_topics(timeout=10)
    return sorted(f"{b.host}:{b.port}" for b in md.brokers.values())


def leader(boot):
    md = AdminClient({"bootstrap.servers": boot}).list_topics(topic=TOPIC, timeout=10)
    t = md.topics.get(TOPIC)
    return t.partitions[0].leader if t and 0 in t.partitions else None


def admin(path, body=None):
    req = urllib.request.Request(ADMIN1 + path, method="POST" if body else "GET",
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, json.loads(r.read() or b"null")


def wait_for(what, cond, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    check(what, False, f"not within {seconds} s")
    return False


want = sorted([BOOT1, BOOT2])
for boot in (BOOT1, BOOT2):
    if wait_for(f"metadata on {boot} lists both brokers", lambda: brokers(boot) == want):
        check(f"metadata on {boot} lists both brokers at their Kafka addresses", True)

# Kept alive until the futures resolve: a dropped client fails them.
creator = AdminClient({"bootstrap.servers": BOOT1})
for f in creator.create_topics([NewTopic(TOPIC, 1, 1)]).values():
    f.result(10)

p = Producer({"bootstrap.servers": BOOT1, "enable.idempotence": True, "acks": "all",
              "linger.ms": 5, "message.timeout.ms": 60000, "topic.metadata.refresh.interval.ms": 60000})
reports = []
transferred = None
for i in range(COUNT):
    p.produce(TOPIC, value=f"m-{i}".encode(), partition=0,
              on_delivery=lambda err, msg: reports.append((err, msg.offset(), msg.value())))
    p.poll(0)
    if i == COUNT // 2:
        # Everything so far lands on node 1, which then owns the stream.
        p.flush(30)
        check("node 1 leads the topic before the transfer", leader(BOOT2) == 1,
              f"leader={leader(BOOT2)}")
        status, body = admin("/admin/transfer", {"stream": f"/{TOPIC}", "toNode": 2})
        transferred = status == 202
        check("transfer to node 2 accepted", transferred, f"{status} {body}")
        wait_for("node 2 owns the stream",
                 lambda: (admin(f"/admin/streams/{TOPIC}")[1].get("owner") or {}).get("nodeId") == 2)
    if i % 50 == 0:
        time.sleep(0.01)
left = p.flush(60)
errors = [r for r in reports if r[0] is not None]
check(f"idempotent producer delivered {COUNT} across the transfer",
      left == 0 and not errors and len(reports) == COUNT,
      f"left={left} errors={errors[:3]} reports={len(reports)}")
offsets = sorted(o for _, o, _ in reports)
check("offsets consecutive from 0 across the transfer", offsets == list(range(COUNT)),
      f"{offsets[:3]}..{offsets[-3:]}")
check("node 2 leads the topic after the transfer",
      leader(BOOT1) == 2 and leader(BOOT2) == 2, f"{leader(BOOT1)} {leader(BOOT2)}")

c = Consumer({"bootstrap.servers": BOOT2, "group.id": "routed-check", "enable.auto.commit": False,
              "auto.offset.reset": "earliest"})
c.assign([TopicPartition(TOPIC, 0, 0)])
got = []
end = time.monotonic() + 60
while len(got) < COUNT and time.monotonic() < end:
    m = c.poll(1.0)
    if m is not None and m.error() is None:
        got.append(m.value().decode())
c.close()
check(f"all {COUNT} read back once, in order, through node 2",
      got == [f"m-{i}" for i in range(COUNT)], f"read {len(got)}: {got[:3]}..{got[-3:]}")

print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
sys.exit(1 if RESULTS["failed"] else 0)
