// The outbox mark's UPDATE alone, on tickbox's SQLite schema, through the
// SQLite that tickbox bundles (libsqlite3-sys): 1,000 pending rows marked
// delivered in marks of BATCH rows, each mark in a transaction of its own,
// the statement prepared once. Under callgrind, counting only the marks
// (`do_mark`: bind, step, reset):
//
//   S=$(ls -d ~/.cargo/registry/src/*/libsqlite3-sys-0.35.0/sqlite3)
//   F="-DSQLITE_CORE -DSQLITE_DEFAULT_FOREIGN_KEYS=1 -DSQLITE_ENABLE_API_ARMOR
//      -DSQLITE_ENABLE_COLUMN_METADATA -DSQLITE_ENABLE_DBSTAT_VTAB -DSQLITE_ENABLE_FTS3
//      -DSQLITE_ENABLE_FTS5 -DSQLITE_ENABLE_JSON1 -DSQLITE_ENABLE_LOAD_EXTENSION=1
//      -DSQLITE_ENABLE_MEMORY_MANAGEMENT -DSQLITE_ENABLE_RTREE -DSQLITE_ENABLE_STAT4
//      -DSQLITE_THREADSAFE=1 -DSQLITE_USE_URI -DHAVE_USLEEP=1 -DHAVE_ISNAN"
//      (libsqlite3-sys's flags, from its build.rs)
//   gcc -O2 -g $F -I$S tools/tickbox-bench/sqlite_mark.c $S/sqlite3.c -o /tmp/sqlite_mark -lpthread -ldl -lm
//   valgrind --tool=callgrind --toggle-collect=do_mark /tmp/sqlite_mark FORM BATCH [DB]
//   callgrind_annotate --inclusive=yes callgrind.out.* | grep sqlite3_step
//
// FORM, how the mark selects its rows (the statement's values as tickbox
// binds them; `PLAN=1` prints the query plan):
//   0  id IN (SELECT unhex(value) FROM json_each(?)), ids as a JSON array
//   1  id IN a recursive CTE over one blob of the ids, 16 bytes each
//   2  id IN (?, ?, ... 128 values), NULL where unused (BATCH <= 128)
//   3  UPDATE ... FROM (SELECT unhex(value) AS id FROM json_each(?)) joined
//   4  UPDATE ... FROM the recursive CTE of form 1, joined
//   5  one statement per id (id = ?)
// The JSON array is written in `do_mark` too (as tickbox writes it on its
// own thread): compare the `sqlite3_step` lines.
#include "sqlite3.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 1000
static unsigned char ids[N][16];
static const unsigned char served[16] = {0xAA,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15};

static void ok(int rc, sqlite3 *db, const char *what) {
  if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
    fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db)); exit(1);
  }
}
static void exec(sqlite3 *db, const char *sql) { ok(sqlite3_exec(db, sql, 0, 0, 0), db, sql); }

/* tickbox's test that a subscription served elsewhere still owes a row. */
static const char *OWED =
  " AND NOT (EXISTS (SELECT 1 FROM tickbox_subscriptions f WHERE NOT (instr(?, ',' || hex(f.id) || ',') > 0))"
  " AND EXISTS (SELECT 1 FROM tickbox_subscriptions s WHERE s.topic = tickbox_outbox.topic"
  " AND NOT (instr(?, ',' || hex(s.id) || ',') > 0) AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d"
  " WHERE d.message_id = tickbox_outbox.id AND d.subscription = s.id)))";

static char sqlbuf[1 << 16];
static char json[N * 40 + 8];
static unsigned char blob[N * 16];
static char set[64];

/* The measured part: one mark's bind, step, reset. */
__attribute__((noinline)) int do_mark(sqlite3 *db, sqlite3_stmt *st, int variant, int from, int count) {
  int rc, p = 1;
  sqlite3_bind_int64(st, p++, 7);
  if (variant == 0 || variant == 3) { /* json */
    char *j = json; *j++ = '[';
    for (int i = 0; i < count; i++) {
      if (i) *j++ = ',';
      *j++ = '"';
      for (int b = 0; b < 16; b++) j += sprintf(j, "%02x", ids[from + i][b]);
      *j++ = '"';
    }
    *j++ = ']'; *j = 0;
    sqlite3_bind_text(st, p++, json, -1, SQLITE_STATIC);
  } else if (variant == 1 || variant == 4) { /* blob */
    for (int i = 0; i < count; i++) memcpy(blob + 16 * i, ids[from + i], 16);
    sqlite3_bind_blob(st, p++, blob, 16 * count, SQLITE_STATIC);
  } else if (variant == 5) { /* one statement per id */
    int changed = 0;
    for (int i = 0; i < count; i++) {
      sqlite3_bind_int64(st, 1, 7);
      sqlite3_bind_blob(st, 2, ids[from + i], 16, SQLITE_STATIC);
      sqlite3_bind_text(st, 3, set, -1, SQLITE_STATIC);
      sqlite3_bind_text(st, 4, set, -1, SQLITE_STATIC);
      ok(sqlite3_step(st), db, "step");
      changed += sqlite3_changes(db);
      sqlite3_reset(st);
    }
    return changed;
  } else if (variant == 2) { /* list of ? (padded with NULL) */
    for (int i = 0; i < 128; i++) {
      if (i < count) sqlite3_bind_blob(st, p++, ids[from + i], 16, SQLITE_STATIC);
      else sqlite3_bind_null(st, p++);
    }
  }
  sqlite3_bind_text(st, p++, set, -1, SQLITE_STATIC);
  sqlite3_bind_text(st, p++, set, -1, SQLITE_STATIC);
  rc = sqlite3_step(st);
  ok(rc, db, "step");
  int changed = sqlite3_changes(db);
  sqlite3_reset(st);
  sqlite3_clear_bindings(st);
  return changed;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: %s FORM BATCH [DB]\n", argv[0]); return 2; }
  int variant = atoi(argv[1]);
  int batch = argc > 2 ? atoi(argv[2]) : 100;
  const char *path = argc > 3 ? argv[3] : "/tmp/sqlite_mark.db";
  remove(path);
  char wal[256]; snprintf(wal, sizeof wal, "%s-wal", path); remove(wal);
  sqlite3 *db;
  ok(sqlite3_open(path, &db), db, "open");
  exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;");
  exec(db,
    "CREATE TABLE tickbox_outbox (id BLOB PRIMARY KEY NOT NULL CHECK (typeof(id) = 'blob' AND length(id) = 16),"
    " topic TEXT NOT NULL, payload TEXT NOT NULL,"
    " correlation_id BLOB NOT NULL CHECK (typeof(correlation_id) = 'blob' AND length(correlation_id) = 16),"
    " causation_id BLOB CHECK (causation_id IS NULL OR (typeof(causation_id) = 'blob' AND length(causation_id) = 16)),"
    " created_at_us BIGINT NOT NULL, delivered_at_us BIGINT, claimed_by BLOB, claimed_until_us BIGINT,"
    " ordering_key TEXT, key_seq BIGINT, key_publisher TEXT, key_previous_at_us BIGINT, due_at_us BIGINT, trace_context TEXT);"
    "CREATE INDEX tickbox_outbox_pending ON tickbox_outbox (id) WHERE delivered_at_us IS NULL;"
    "CREATE INDEX tickbox_outbox_pending_keys ON tickbox_outbox (topic, ordering_key, key_seq)"
    " WHERE delivered_at_us IS NULL AND ordering_key IS NOT NULL;"
    "CREATE TABLE tickbox_subscriptions (id BLOB PRIMARY KEY NOT NULL, module TEXT NOT NULL, handler TEXT NOT NULL,"
    " topic TEXT NOT NULL, subscribed_at_us BIGINT NOT NULL, seen_at_us BIGINT NOT NULL, alive_until_us BIGINT NOT NULL);"
    "CREATE INDEX tickbox_subscriptions_topic ON tickbox_subscriptions (topic);"
    "CREATE TABLE tickbox_outbox_done (message_id BLOB NOT NULL, subscription BLOB NOT NULL,"
    " PRIMARY KEY (message_id, subscription)) WITHOUT ROWID;");
  sqlite3_stmt *sub;
  ok(sqlite3_prepare_v2(db, "INSERT INTO tickbox_subscriptions VALUES (?, 'm', 'h', 'bench.order', 1, 1, 9000000000000000000)", -1, &sub, 0), db, "p");
  sqlite3_bind_blob(sub, 1, served, 16, SQLITE_STATIC); ok(sqlite3_step(sub), db, "sub"); sqlite3_finalize(sub);
  { char *s = set; *s++ = ','; for (int b = 0; b < 16; b++) s += sprintf(s, "%02X", served[b]); *s++ = ','; *s = 0; }
  exec(db, "BEGIN");
  sqlite3_stmt *ins;
  ok(sqlite3_prepare_v2(db, "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, created_at_us, claimed_by, claimed_until_us)"
     " VALUES (?, 'bench.order', ?, ?, ?, ?, ?)", -1, &ins, 0), db, "p");
  for (int i = 0; i < N; i++) {
    unsigned long long t = 0x0190000000000000ULL + (unsigned long long)i * 4096;
    for (int b = 0; b < 8; b++) ids[i][b] = (t >> (56 - 8 * b)) & 0xff;
    for (int b = 8; b < 16; b++) ids[i][b] = (unsigned char)(i * 31 + b * 7);
    char payload[128]; snprintf(payload, sizeof payload, "{\"order\":%d,\"customer\":\"customer-%d\",\"amount\":%d}", i, i % 97, i * 3);
    sqlite3_bind_blob(ins, 1, ids[i], 16, SQLITE_STATIC);
    sqlite3_bind_text(ins, 2, payload, -1, SQLITE_TRANSIENT);
    sqlite3_bind_blob(ins, 3, ids[i], 16, SQLITE_STATIC);
    sqlite3_bind_int64(ins, 4, 1700000000000000LL + i);
    sqlite3_bind_blob(ins, 5, served, 16, SQLITE_STATIC);
    sqlite3_bind_int64(ins, 6, 1800000000000000LL);
    ok(sqlite3_step(ins), db, "ins"); sqlite3_reset(ins);
  }
  sqlite3_finalize(ins);
  exec(db, "COMMIT");
  const char *rows =
    variant == 0 ? "(SELECT unhex(value) FROM json_each(?))" :
    variant == 1 ? "(SELECT substr(?2, i, 16) FROM ids)" : variant == 5 ? "(?)" : 0;
  char list[128 * 3 + 4];
  if (variant == 2) { char *l = list; *l++ = '('; for (int i = 0; i < 128; i++) { if (i) *l++ = ','; *l++ = '?'; } *l++ = ')'; *l = 0; rows = list; }
  if (variant == 1)
    snprintf(sqlbuf, sizeof sqlbuf, "WITH RECURSIVE ids(i) AS (SELECT 1 UNION ALL SELECT i + 16 FROM ids WHERE i + 16 <= length(?2)) "
      "UPDATE tickbox_outbox SET delivered_at_us = ?1, claimed_until_us = NULL WHERE id IN %s%s", rows, OWED);
  else if (variant == 3)
    snprintf(sqlbuf, sizeof sqlbuf, "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL "
      "FROM (SELECT unhex(value) AS mid FROM json_each(?)) AS l WHERE tickbox_outbox.id = l.mid%s", OWED);
  else if (variant == 4)
    snprintf(sqlbuf, sizeof sqlbuf, "WITH RECURSIVE ids(i) AS (SELECT 1 UNION ALL SELECT i + 16 FROM ids WHERE i + 16 <= length(?2)) "
      "UPDATE tickbox_outbox SET delivered_at_us = ?1, claimed_until_us = NULL FROM ids WHERE tickbox_outbox.id = substr(?2, ids.i, 16)%s", OWED);
  else
    snprintf(sqlbuf, sizeof sqlbuf, "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL WHERE id IN %s%s", rows, OWED);
  sqlite3_stmt *st;
  ok(sqlite3_prepare_v2(db, sqlbuf, -1, &st, 0), db, sqlbuf);
  if (getenv("PLAN")) {
    char eq[(1 << 16) + 32]; snprintf(eq, sizeof eq, "EXPLAIN QUERY PLAN %s", sqlbuf);
    sqlite3_stmt *e; ok(sqlite3_prepare_v2(db, eq, -1, &e, 0), db, "eqp");
    while (sqlite3_step(e) == SQLITE_ROW) printf("%d %d %s\n", sqlite3_column_int(e, 0), sqlite3_column_int(e, 1), sqlite3_column_text(e, 3));
    sqlite3_finalize(e);
  }
  int total = 0;
  for (int from = 0; from < N; from += batch) {
    int count = N - from < batch ? N - from : batch;
    exec(db, "BEGIN IMMEDIATE");
    total += do_mark(db, st, variant, from, count);
    exec(db, "COMMIT");
  }
  sqlite3_finalize(st);
  sqlite3_stmt *c; sqlite3_prepare_v2(db, "SELECT count(*) FROM tickbox_outbox WHERE delivered_at_us IS NULL", -1, &c, 0);
  sqlite3_step(c); printf("variant %d: marked %d, pending %d\n", variant, total, sqlite3_column_int(c, 0)); sqlite3_finalize(c);
  sqlite3_close(db);
  return 0;
}
