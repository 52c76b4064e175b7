// kafkajs against a real `pico serve` (driven by scripts/kafka-e2e.sh).
//
//   node kafkajs.cjs KAFKAJS_DIR BOOTSTRAP HTTP_URL
//
// An idempotent producer (acks=all) sends keyed records with headers; a consumer group reads
// them back from the beginning and commits; the records are checked field by field, and over
// HTTP at the same offsets. Prints `N passed, N failed`; exits non-zero on any failure.
'use strict';

const path = require('path');
const [kafkajsDir, boot, http] = process.argv.slice(2);
const { Kafka, logLevel } = require(path.join(kafkajsDir, 'node_modules', 'kafkajs'));

const TOPIC = 'kjs';
const COUNT = 200;
const results = { passed: 0, failed: 0 };

function check(name, ok, detail) {
  results[ok ? 'passed' : 'failed'] += 1;
  console.log(`${ok ? 'ok' : 'FAILED'}: ${name}${!ok && detail ? ` -- ${detail}` : ''}`);
}

function value(i) {
  // Odd records carry every byte value, so the round trip is checked on binary bodies too.
  return i % 2 ? Buffer.from(Array.from({ length: i + 1 }, (_, j) => (i + j) % 256)) : Buffer.from(`kjs-${i}`);
}

async function produce(kafka) {
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const offsets = [];
  try {
    // Batches of 20: each send is one Produce request carrying one RecordBatch.
    for (let start = 0; start < COUNT; start += 20) {
      const messages = [];
      for (let i = start; i < start + 20; i++) {
        messages.push({ key: `k${i}`, value: value(i), headers: { n: String(i) } });
      }
      const meta = await producer.send({ topic: TOPIC, acks: -1, messages });
      offsets.push(Number(meta[0].baseOffset));
    }
  } finally {
    await producer.disconnect();
  }
  const want = Array.from({ length: COUNT / 20 }, (_, b) => b * 20);
  check(`kafkajs idempotent producer acks=all delivered ${COUNT}`, JSON.stringify(offsets) === JSON.stringify(want),
    JSON.stringify(offsets));
}

async function consume(kafka) {
  const consumer = kafka.consumer({ groupId: 'kjs-group', sessionTimeout: 10000, heartbeatInterval: 500 });
  await consumer.connect();
  const got = [];
  let done;
  const all = new Promise((resolve) => { done = resolve; });
  try {
    await consumer.subscribe({ topic: TOPIC, fromBeginning: true });
    await consumer.run({
      autoCommit: true,
      eachMessage: async ({ partition, message }) => {
        got.push({ partition, offset: Number(message.offset), key: message.key, value: message.value, headers: message.headers });
        if (got.length >= COUNT) done();
      },
    });
    await Promise.race([all, new Promise((resolve) => setTimeout(resolve, 30000))]);
  } finally {
    await consumer.disconnect();
  }
  check(`kafkajs consumer group read ${COUNT}`, got.length === COUNT, `${got.length}`);
  check('kafkajs offsets are the stream offsets', got.every((m, i) => m.partition === 0 && m.offset === i),
    JSON.stringify(got.slice(0, 3).map((m) => m.offset)));
  check('kafkajs values byte-exact', got.every((m, i) => m.value.equals(value(i))));
  check('kafkajs keys', got.every((m, i) => m.key && m.key.toString() === `k${i}`));
  check('kafkajs headers', got.every((m, i) => m.headers.n && m.headers.n.toString() === String(i)),
    JSON.stringify(got[0] && got[0].headers));

  const admin = kafka.admin();
  await admin.connect();
  try {
    const committed = await admin.fetchOffsets({ groupId: 'kjs-group', topics: [TOPIC] });
    const off = committed[0].partitions[0].offset;
    check('kafkajs committed offset at the end', off === String(COUNT), JSON.stringify(committed));
  } finally {
    await admin.disconnect();
  }
}

async function overHttp() {
  const r = await fetch(`${http}/${TOPIC}?seq=0&count=${COUNT}&format=json`);
  const recs = await r.json();
  check('kafkajs records read over HTTP at the same offsets',
    recs.length === COUNT && recs.every((rec, i) => rec.seq === i && rec.key === `k${i}`
      && Buffer.from(rec.body_b64 !== undefined ? Buffer.from(rec.body_b64, 'base64') : Buffer.from(rec.body)).equals(value(i))
      && rec.headers && rec.headers.n === String(i)),
    JSON.stringify(recs[1]));
}

// A nested stream created over HTTP is the topic `logs.api` over Kafka (the dotted alias).
async function dottedAlias(kafka) {
  const put = await fetch(`${http}/logs/api`, { method: 'PUT' });
  check('nested stream /logs/api created over HTTP', put.status === 201 || put.status === 200, `${put.status}`);
  const admin = kafka.admin();
  await admin.connect();
  try {
    const topics = await admin.listTopics();
    check('the nested stream is listed as topic logs.api', topics.includes('logs.api'), JSON.stringify(topics));
  } finally {
    await admin.disconnect();
  }
  const producer = kafka.producer();
  await producer.connect();
  try {
    await producer.send({ topic: 'logs.api', acks: -1, messages: [{ value: 'nested-0' }, { value: 'nested-1' }] });
  } finally {
    await producer.disconnect();
  }
  const r = await fetch(`${http}/logs/api?seq=0&count=10&format=json`);
  const recs = await r.json();
  check('produced to logs.api, read over HTTP from /logs/api',
    JSON.stringify(recs.map((rec) => rec.body)) === JSON.stringify(['nested-0', 'nested-1']), JSON.stringify(recs));
}

async function guarded(name, fn) {
  try {
    await fn();
  } catch (e) {
    check(name, false, String(e && e.stack ? e.stack : e));
  }
}

(async () => {
  const kafka = new Kafka({ clientId: 'pico-e2e', brokers: [boot], logLevel: logLevel.ERROR, retry: { retries: 3 } });
  await guarded('kafkajs produce', () => produce(kafka));
  await guarded('kafkajs consume', () => consume(kafka));
  await guarded('kafkajs over http', overHttp);
  await guarded('kafkajs dotted alias', () => dottedAlias(kafka));
  console.log(`kafkajs: ${results.passed} passed, ${results.failed} failed`);
  process.exit(results.failed ? 1 : 0);
})();
