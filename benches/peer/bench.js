#!/usr/bin/env node
// The tickbox benchmark workload through the npm package pg-transactional-outbox
// (transactional outbox + inbox for PostgreSQL), for a side-by-side comparison.
//
// Run by `cargo run --release -p tickbox-bench --features postgres -- --backend postgres --peer ...`
// or on its own:
//   npm ci --prefix benches/peer
//   node benches/peer/bench.js --database-url postgres://postgres@127.0.0.1:5432/test \
//       --messages 20000 --concurrency 4 [--mode inbox|direct] [--batch 8] [--poll-ms 1] [--lock-ms 1000] [--json]
//
// Workload, as in tools/tickbox-bench: C producer loops each commit a business row
// and an outbox message per transaction; one handler per message inserts a
// business row in its transaction; the run ends when N messages are handled.
//
// Modes:
// - inbox (default): the package's full pattern. The outbox polling listener
//   takes each outbox row and stores it in the inbox table (in the listener's
//   transaction, which also marks the outbox row processed); the inbox polling
//   listener then runs the handler in a transaction that marks the inbox row
//   processed. This is what tickbox does (outbox, then an inbox guard per
//   handler).
// - direct: the handler runs inside the outbox listener's transaction, with no
//   inbox table. Same database only; exactly-once rests on the outbox row's lock
//   and processed_at. The package's cheapest configuration for this workload.
//
// Best settings found (see BENCHMARKS.md): messages are `concurrency:
// 'parallel'` (the default 'sequential' processes one message per segment at a
// time), poisonous-message and max-attempts protection off, cleanup off,
// polling interval 1 ms, batch size 2 x C, handler pool of batch-size
// connections, a 1 s lock (a message whose processing attempt collided with a
// poll waits for its lock to expire: the default 5 s lock makes that tail long). Logical replication needs wal_level=logical, which the server
// here does not have (and changing it needs a restart), so polling is used.

'use strict';

const crypto = require('node:crypto');
const { Pool } = require('pg');
const {
  DatabaseSetup,
  getDisabledLogger,
  initializeMessageStorage,
  initializePollingMessageListener,
} = require('pg-transactional-outbox');

function parseArgs(argv) {
  const args = {
    databaseUrl: process.env.TICKBOX_PG_URL || 'postgres://postgres@127.0.0.1:5432/test',
    messages: 20000,
    concurrency: 4,
    mode: 'inbox',
    batch: null,
    pollMs: 1,
    lockMs: 1000,
    rate: null,
    json: false,
  };
  for (let i = 2; i < argv.length; i++) {
    const flag = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new Error(`${flag} needs a value`);
      return argv[++i];
    };
    switch (flag) {
      case '--database-url': args.databaseUrl = value(); break;
      case '--messages': args.messages = Number(value().replace(/_/g, '')); break;
      case '--concurrency': args.concurrency = Number(value()); break;
      case '--mode': args.mode = value(); break;
      case '--batch': args.batch = Number(value()); break;
      case '--poll-ms': args.pollMs = Number(value()); break;
      case '--lock-ms': args.lockMs = Number(value()); break;
      case '--rate': args.rate = Number(value()); break;
      case '--json': args.json = true; break;
      default: throw new Error(`unknown argument ${flag}`);
    }
  }
  if (!['inbox', 'direct'].includes(args.mode)) throw new Error('--mode is inbox or direct');
  if (args.batch === null) args.batch = 2 * args.concurrency;
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function percentiles(values) {
  if (values.length === 0) return null;
  const sorted = Float64Array.from(values).sort();
  const at = (q) => sorted[Math.round((sorted.length - 1) * q)];
  return { samples: sorted.length, p50: at(0.5), p99: at(0.99), max: sorted[sorted.length - 1] };
}

async function main() {
  const args = parseArgs(process.argv);
  const schema = `peer_${crypto.randomBytes(4).toString('hex')}`;
  const admin = new Pool({ connectionString: args.databaseUrl, max: 1 });
  const logger = getDisabledLogger();

  const setup = (outboxOrInbox) => ({
    outboxOrInbox,
    database: 'test',
    schema,
    table: outboxOrInbox,
    listenerRole: 'postgres',
    nextMessagesName: `next_${outboxOrInbox}_messages`,
  });
  // The package's own DDL: tables, polling functions and indexes. The index
  // statements name no schema, so run them with the fresh schema first in the
  // search_path.
  const ddl = [
    `CREATE SCHEMA ${schema}`,
    `SET search_path TO ${schema}`,
    DatabaseSetup.dropAndCreateTable(setup('outbox')),
    DatabaseSetup.dropAndCreateTable(setup('inbox')),
    DatabaseSetup.createPollingFunction(setup('outbox')),
    DatabaseSetup.createPollingFunction(setup('inbox')),
    DatabaseSetup.setupPollingIndexes(setup('outbox')),
    DatabaseSetup.setupPollingIndexes(setup('inbox')),
    `CREATE TABLE ${schema}.orders (n bigint PRIMARY KEY, note text NOT NULL)`,
    `CREATE TABLE ${schema}.effects (n bigint PRIMARY KEY, message_id uuid NOT NULL)`,
  ].join(';\n');
  await admin.query(ddl);
  try {
    await measure(args, schema, admin, logger);
  } finally {
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  }
}

async function measure(args, schema, admin, logger) {

  const commitAt = new Float64Array(args.messages);
  const handlerEndAt = new Float64Array(args.messages);
  let handlerEnds = 0;
  const t0 = performance.now();

  // The handler: one business row per message, in the transaction that marks
  // the (inbox or outbox) row processed.
  const business = {
    handle: async (message, client) => {
      const n = message.payload.n;
      await client.query(`INSERT INTO ${schema}.effects (n, message_id) VALUES ($1, $2)`, [n, message.id]);
      handlerEndAt[n] = performance.now();
      handlerEnds++;
    },
  };

  const dbConfig = { connectionString: args.databaseUrl };
  const listenerSettings = (table) => ({
    dbSchema: schema,
    dbTable: table,
    nextMessagesFunctionSchema: schema,
    nextMessagesFunctionName: `next_${table}_messages`,
    nextMessagesBatchSize: args.batch,
    nextMessagesPollingIntervalInMs: args.pollMs,
    nextMessagesLockInMs: args.lockMs,
    enableMaxAttemptsProtection: false,
    enablePoisonousMessageProtection: false,
    messageCleanupIntervalInMs: 0,
  });
  const listenerConfig = (table) => ({
    outboxOrInbox: table,
    dbListenerConfig: { ...dbConfig, max: 2 },
    // Each message in a batch runs its own transaction on this pool.
    dbHandlerConfig: { ...dbConfig, max: args.batch },
    settings: listenerSettings(table),
  });

  const storeOutbox = initializeMessageStorage(listenerConfig('outbox'), logger);
  const storeInbox = initializeMessageStorage(listenerConfig('inbox'), logger);
  const shutdowns = [];
  if (args.mode === 'inbox') {
    // Outbox -> inbox: the "publisher" stores the message in the inbox table
    // in the outbox listener's transaction (ON CONFLICT (id) DO NOTHING
    // deduplicates redeliveries).
    const bridge = { handle: async (message, client) => storeInbox(message, client) };
    shutdowns.push(initializePollingMessageListener(listenerConfig('outbox'), bridge, logger)[0]);
    shutdowns.push(initializePollingMessageListener(listenerConfig('inbox'), business, logger)[0]);
  } else {
    shutdowns.push(initializePollingMessageListener(listenerConfig('outbox'), business, logger)[0]);
  }

  // Producers.
  const producerPool = new Pool({ ...dbConfig, max: args.concurrency });
  let next = 0;
  const producer = async () => {
    const client = await producerPool.connect();
    try {
      for (;;) {
        const k = next++;
        if (k >= args.messages) return;
        if (args.rate) {
          const wait = t0 + (k * 1000) / args.rate - performance.now();
          if (wait > 0) await sleep(wait);
        }
        await client.query('BEGIN');
        await client.query(`INSERT INTO ${schema}.orders (n, note) VALUES ($1, $2)`, [k, `order ${k}`]);
        await storeOutbox(
          {
            id: crypto.randomUUID(),
            aggregateType: 'order',
            aggregateId: String(k),
            messageType: 'bench.work',
            concurrency: 'parallel',
            payload: { n: k },
          },
          client,
        );
        await client.query('COMMIT');
        commitAt[k] = performance.now();
      }
    } finally {
      client.release();
    }
  };
  await Promise.all(Array.from({ length: args.concurrency }, producer));
  const produced = (performance.now() - t0) / 1000;

  // Handled means committed: wait for the handler count, then for the rows.
  const table = args.mode === 'inbox' ? 'inbox' : 'outbox';
  let lastProgress = [0, performance.now()];
  for (;;) {
    if (handlerEnds >= args.messages) {
      const { rows } = await admin.query(
        `SELECT count(*)::int AS n FROM ${schema}.${table} WHERE processed_at IS NOT NULL`,
      );
      if (rows[0].n >= args.messages) break;
    }
    if (handlerEnds !== lastProgress[0]) lastProgress = [handlerEnds, performance.now()];
    else if (performance.now() - lastProgress[1] > 60000) {
      await Promise.all(shutdowns.map((s) => s()));
      await producerPool.end();
      throw new Error(`stalled: ${handlerEnds} of ${args.messages} handled, none for 60 s`);
    }
    await sleep(1);
  }
  const seconds = (performance.now() - t0) / 1000;

  await Promise.all(shutdowns.map((s) => s()));
  await producerPool.end();
  const { rows } = await admin.query(`SELECT count(*)::int AS n FROM ${schema}.effects`);
  if (rows[0].n !== args.messages) throw new Error(`${rows[0].n} effects, expected ${args.messages}`);

  const latencies = [];
  for (let k = 0; k < args.messages; k++) {
    if (commitAt[k] && handlerEndAt[k]) latencies.push(handlerEndAt[k] - commitAt[k]);
  }
  const latency = percentiles(latencies);
  const perS = args.messages / seconds;
  console.log(
    `pg-transactional-outbox ${args.mode} mode · concurrency ${args.concurrency} · batch ${args.batch} · poll ${args.pollMs} ms: ` +
      `${args.messages} messages in ${seconds.toFixed(2)} s = ${perS.toFixed(0)}/s ` +
      `(produced ${(args.messages / produced).toFixed(0)}/s); commit->handler end ms p50 ${latency.p50.toFixed(1)} ` +
      `p99 ${latency.p99.toFixed(1)} max ${latency.max.toFixed(1)}`,
  );
  if (args.json) {
    console.log(
      JSON.stringify({
        peer: 'pg-transactional-outbox',
        version: require('pg-transactional-outbox/package.json').version,
        mode: args.mode,
        concurrency: args.concurrency,
        messages: args.messages,
        batch: args.batch,
        poll_ms: args.pollMs,
        lock_ms: args.lockMs,
        rate: args.rate,
        seconds,
        peer_per_s: perS,
        produced_per_s: args.messages / produced,
        latency_measured_to: 'handler end',
        p50_ms: latency.p50,
        p99_ms: latency.p99,
        max_ms: latency.max,
      }),
    );
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
