//! tickbox — an actor-based, in-process message bus with a transactional
//! outbox and an idempotent inbox.
//!
//! An application split into modules (a modular monolith) gives each module
//! its own database. Code changes a module's data and publishes messages in
//! one transaction; the messages land in the module's **outbox** table and
//! exist if and only if that transaction commits. The **bus** delivers every
//! committed message at least once to every subscribed **handler**. Each
//! handler runs in a transaction on its own module's database that first
//! records `(message id, handler)` in the module's **inbox**; a message that
//! arrives again finds the row and is skipped. At-least-once delivery plus an
//! idempotent receiver gives effectively-once processing.
//!
//! # Getting started
//!
//! ```no_run
//! use diesel_async::RunQueryDsl;
//! use serde::{Deserialize, Serialize};
//! use tickbox::{Bus, Delivery, Handler, HandlerError, Message, Module, Sqlite, Tx};
//!
//! #[derive(Serialize, Deserialize)]
//! struct OrderPlaced { order_id: i64 }
//! impl Message for OrderPlaced { const TOPIC: &'static str = "orders.order_placed"; }
//!
//! struct ReserveStock;
//! impl Handler<Sqlite> for ReserveStock {
//!     type Message = OrderPlaced;
//!     async fn handle(
//!         &self,
//!         tx: &mut Tx<Sqlite>,
//!         order: OrderPlaced,
//!         _delivery: &Delivery,
//!     ) -> Result<(), HandlerError> {
//!         diesel::sql_query("INSERT INTO reservations (order_id) VALUES (?)")
//!             .bind::<diesel::sql_types::BigInt, _>(order.order_id)
//!             .execute(tx.conn())
//!             .await?;
//!         Ok(())
//!     }
//! }
//!
//! #[actix::main]
//! async fn main() -> tickbox::Result<()> {
//!     let orders = Module::<Sqlite>::builder("orders", "data/orders.db")
//!         .publishes::<OrderPlaced>()
//!         .start()
//!         .await?;
//!     let warehouse = Module::<Sqlite>::builder("warehouse", "data/warehouse.db")
//!         .handler("warehouse.reserve_stock", ReserveStock)
//!         .start()
//!         .await?;
//!     let bus = Bus::builder().module(&orders).module(&warehouse).start().await?;
//!
//!     orders
//!         .transaction(async move |tx| {
//!             diesel::sql_query("INSERT INTO orders (id) VALUES (1)").execute(tx.conn()).await?;
//!             tx.publish(&OrderPlaced { order_id: 1 })?;
//!             Ok::<_, tickbox::Error>(())
//!         })
//!         .await?;
//!     bus.stop().await;
//!     Ok(())
//! }
//! ```
//!
//! # Vocabulary
//!
//! One word, one meaning, in the code, the docs, the logs and the metrics:
//!
//! - **Module** — a part of the application with its own database (pool),
//!   outbox and inbox; it hosts handlers ([`Module`], [`ModuleHandle`]).
//! - **Message** — a serde type with a stable topic ([`Message`]); stored and
//!   carried as an **envelope** ([`Envelope`]): id (UUIDv7), topic, JSON
//!   payload, correlation and causation ids, publication time.
//! - **Publish** — write a message to the module's outbox inside a
//!   transaction ([`Tx::publish`]); it exists iff the transaction commits.
//! - **Outbox** — the module's table of published messages, each **pending**
//!   until **finished** (marked delivered, or deleted with an outbox
//!   retention of zero).
//! - **Handler** — named module code for one message type ([`Handler`]); its
//!   name is half of the inbox key.
//! - **Subscription** — a handler, in any process, recorded as receiving an
//!   outbox's topic ([`Subscription`]).
//! - **Delivery** — one attempt to run one message through one handler
//!   ([`Delivery`]): it ends **handled**, **skipped** as a duplicate, or
//!   **failed** ([`Outcome`], [`DeliveryError`]); a failed one is retried
//!   until its policy gives up and it becomes a **dead letter**
//!   ([`DeadLetter`]).
//! - **Inbox** — the module's table of `(message id, handler)` rows, written
//!   in the delivery's own transaction; the **inbox guard** is the code
//!   path that writes it before the handler runs.
//! - **Bus** — what delivers: one **dispatcher** per outbox takes committed
//!   messages (**announced** in memory, or found by a **scan**), **claims**
//!   them for a lease, and sends each to its handlers ([`Bus`],
//!   [`BusHandle`]).
//! - **Sweep** — the retention sweep only: deleting old inbox rows and
//!   finished outbox rows ([`Retention`]); looking through the outbox for
//!   pending messages is a scan.
//! - **Watchdog** — counts and reports messages pending longer than
//!   [`BusBuilder::stalled_after`].
//!
//! Words of the code, one line each where no usual word fits:
//!
//! - **Tick the inbox** (`tick_inbox`) — insert the inbox row, or find it
//!   there already: the inbox guard's first statement.
//! - **Served** (`Served`) — a subscription a running bus delivers to
//!   (one of its handlers, or its broker).
//! - **Upkeep** — what a dispatcher does every scan interval besides
//!   scanning: says its subscriptions are served, finishes what every
//!   subscription is done with, runs the watchdog.
//! - **Partly done** (`Owed::PartlyDone`) — a message some subscriptions
//!   are done with and others still owe.
//! - **Lane**, **turn** — a key's messages along one route (a handler, or
//!   the broker), and a message's place in it: one at a time, in order.
//! - **Dead-letter** (`record_dead_letter`) — record a message a handler
//!   gave up on as a dead letter of its module.
//!
//! # How the bus learns of committed messages
//!
//! - A module on a bus writes its messages already claimed by that bus and
//!   hands them over in memory as the transaction commits: no polling, and
//!   no statement beyond the outbox insert.
//! - PostgreSQL: a transaction that publishes while its module is on no bus
//!   of its process (a worker or command-line tool that only publishes, a
//!   module not joined to a bus, or one whose bus has stopped) sends
//!   `pg_notify` on the outbox's channel ([`ModuleHandle::wakeup_channel`],
//!   one per database and schema) just before COMMIT, so listeners hear it
//!   only if the messages commit. Every
//!   bus listens on the channel of each of its PostgreSQL modules, on a
//!   connection of its own outside the module's pool (one more connection
//!   per module), and scans that outbox when notified. If that connection
//!   fails, the bus reconnects with backoff and scans once listening again.
//! - SQLite, MariaDB and MySQL have no notifications: commits made by
//!   another process are found by the periodic scan
//!   ([`BusBuilder::scan_interval`], 2 s by default).
//! - Every bus scans its outboxes at start and every scan interval, which
//!   finishes what a crash left behind. A row a scan cannot read (text that
//!   is not UTF-8, a creation time that is not an integer: SQLite stores any
//!   value in any column) becomes a dead letter of the outbox's module with
//!   the reason, and is marked delivered; the other rows keep flowing.
//!
//! # Several processes
//!
//! Processes may share a module's database: replicas of one program, or a
//! modular monolith whose modules move to processes of their own before they
//! move to database servers of their own. Every handler, in whichever
//! process, receives every message of its topic committed after its
//! subscription was first recorded (and every one still pending then).
//!
//! - **Subscriptions are recorded where every process sees them**: in the
//!   publishing module's database (`tickbox_subscriptions`), one row per
//!   handler — its module, its name and its topic — keyed by an id derived
//!   from `(module, handler)`, the same pair that keys the inbox. A bus
//!   records the handlers it serves in each outbox on it when it starts, and
//!   says again that they are served every scan interval (so each row shows
//!   whether a running process serves it).
//! - **A message is finished only when every subscription is done with it.**
//!   When the subscribers on a bus are done with a message, the bus marks it
//!   delivered in one statement that also checks that no subscription it does
//!   not serve still owes it. The check is in the statement, against the
//!   table as committed, so a subscription another process recorded a moment
//!   earlier is never missed; in the common case (one process serves every
//!   subscription) it costs an index lookup and nothing else changes.
//! - **Otherwise the message is handed over**: the bus records that its own
//!   subscriptions are done with it (`tickbox_outbox_done`), releases its
//!   claim, and (PostgreSQL) wakes the other processes' buses. A bus claims
//!   only rows one of its subscriptions still owes (or rows of a topic nobody
//!   subscribes to, which it finds without subscribers or unknown), so the
//!   bus serving the rest takes the message next and finishes it. Should the
//!   last two parts be recorded at the same moment, the periodic upkeep
//!   finishes the message. Each handler's inbox keeps its effect single
//!   whatever happens in between, replicas included.
//! - **A stopped process keeps its messages**: its subscriptions stay and
//!   the messages they owe wait for it, so a restart (or a deployment)
//!   loses nothing. A handler removed for good is retired with
//!   [`ModuleHandle::retire_subscription`] (or `tickbox subscriptions
//!   retire MODULE HANDLER --yes`); until then it shows in [`ModuleHandle::subscriptions`], in
//!   `tickbox status`, in the `tickbox_subscription_lag_seconds` gauge and in
//!   the watchdog's warnings ([`BusBuilder::stalled_after`]). A subscription
//!   a running process serves cannot be retired.
//! - **What is refused at start**: a handler that a running process records
//!   on another topic ([`Error::SubscriptionConflict`]: two versions of one
//!   handler would each miss the other's messages), a handler whose topic no
//!   module on the bus publishes ([`Error::UnsubscribableTopic`]: a process
//!   running a subscriber must also open the publishing module, whose outbox
//!   it reads), and a database migrated by a newer tickbox
//!   ([`Error::SchemaVersion`]: this version would not honour what that one
//!   records).
//! - Claims keep processes from delivering the same row at once: a message
//!   is written claimed by the publishing process's bus, scans claim other
//!   rows (`FOR UPDATE SKIP LOCKED` on PostgreSQL), a running bus renews its
//!   claims, and a dead process's claims are taken over when their lease
//!   ([`BusBuilder::claim_lease`]) expires.
//!
//! # Ordering keys
//!
//! Messages published with [`Tx::publish_keyed`] reach each handler in the
//! order their transactions committed, per key: a handler never runs one
//! before an earlier-committed message of the same key (and topic) has been
//! handled, skipped as a duplicate, or dead-lettered by that handler. Other
//! keys and handlers run concurrently; a failing message holds back only its
//! key.
//!
//! - **Numbering**: the publishing module gives each key's messages the
//!   numbers 1, 2, 3… at commit, under a lock on the key's counter row
//!   (`tickbox_key_sequences`), so numbers follow commit order ([`Keyed`],
//!   [`Delivery::sequence`]).
//! - **Lanes**: the bus takes a key's messages along each route (a handler,
//!   or the relay) one at a time, lowest number first.
//! - **Progress**: each handler's place in each key (`tickbox_key_progress`,
//!   in its own database) is checked and advanced inside the delivery's
//!   transaction: a message whose predecessor is not done waits
//!   ([`FailureKind::Early`], no attempt used), one already passed is
//!   skipped. The order therefore holds across processes, crashes, batches
//!   and the broker.
//! - **Parking**: a keyed dead letter parks its key for its handler; the
//!   key's later messages become dead letters parked behind it
//!   ([`FailureKind::Parked`], [`DeadLetter::parked_behind`]) until it is
//!   replayed ([`ModuleHandle::replay_dead_letter`], which then delivers them
//!   in order) or skipped ([`ModuleHandle::skip_dead_letter`]). Claims skip a
//!   keyed row while another bus holds an earlier one of its key.
//!
//! # Scheduled messages
//!
//! [`Tx::publish_at`] and [`Tx::publish_after`] (and
//! [`Tx::publish_keyed_at`], [`Tx::publish_keyed_after`]) publish a message
//! to be delivered later — a saga's timeout — and [`Tx::cancel_scheduled`]
//! cancels one that is not yet due.
//!
//! - **Storage**: the outbox row carries its due time (`due_at_us`) and an
//!   id whose UUIDv7 time is the due time, so the pending index, in id
//!   order, is also the index by due time. Claims read it only up to the
//!   last id due by now (`message::due_by`): rows due later cost a
//!   scan nothing. A scheduled row is written unclaimed and not announced.
//! - **Timing**: each dispatcher keeps one timer for its outbox, set by
//!   this process's commits and, after each scan, by a look along the
//!   pending index at the next rows ahead of now; it scans when the timer
//!   fires. The look also claims stray rows whose ids lie ahead of now
//!   without being scheduled (written by hand, or by a process whose clock
//!   runs ahead), which a bounded scan would not read.
//! - **Exactness**: once due, the row is claimed like any other, so
//!   restarts, several processes and the relay deliver it as they deliver
//!   everything, never before it is due. A cancellation deletes only a row
//!   that is neither due nor claimed.
//! - **Ordering keys**: a scheduled keyed row is written without a number
//!   and numbered when a bus first takes it after it is due (in a
//!   transaction that fails, and leaves the row to the next scan, if
//!   another bus numbered it meanwhile): it takes its place in its key
//!   then, after every message committed before, and holds nothing back
//!   while it waits.
//!
//! # Over RabbitMQ
//!
//! When modules move to services with databases of their own, the bus runs
//! over a RabbitMQ broker (`BusBuilder::amqp`, feature `amqp`); handlers,
//! transactions, the inbox guard, retries and dead letters stay as they are.
//!
//! - **Topology**, declared by tickbox every time it connects (idempotent):
//!   one durable topic exchange, `tickbox.<namespace>` (`Amqp::exchange`),
//!   whose routing keys are topics; one durable quorum queue per handler,
//!   `tickbox.<namespace>.<module>.<handler>` (`Amqp::queue`), bound with
//!   the handler's topic. One topic exchange rather than one per topic: a
//!   new topic needs no new exchange, and a queue's binding says exactly
//!   what its handler receives. A queue declared elsewhere with other
//!   settings stops the bus's start with [`Error::BrokerRefused`].
//! - **The relay**: each committed outbox message is published (persistent,
//!   `mandatory`) and marked delivered only once the broker confirms it.
//!   No confirm within `Amqp::confirm_timeout`, a nack, a closed channel,
//!   a lost connection, or no queue bound to the topic yet: the message
//!   stays pending and is published again (the inbox absorbs a duplicate).
//!   Publishes are pipelined: the relay sends what the outboxes hand over
//!   back to back on its channel and awaits the confirms together, at most
//!   `Amqp::publish_window` (256) unconfirmed at once; the confirmed rows
//!   are marked in batches. A nack or a missing queue fails only that
//!   message, whose key stops there until it is published again.
//!   Commits hand their messages over at once, as in one process; scans
//!   pick up what a crash left. Several relays over one outbox share it
//!   through claims, as buses do; the relay is recorded there as a
//!   subscription (`amqp <exchange>` / `relay <topic>`).
//! - **Consumers**: one per handler, with a bounded prefetch
//!   (`Amqp::prefetch`). Each message runs through the inbox guard with
//!   the handler's retry policy (backoff without holding up the others) and
//!   is acknowledged after its transaction commits, after it is found a
//!   duplicate, or after it is recorded as a dead letter in the handler's
//!   module. Acknowledgements are coalesced: deliveries finished together
//!   and older than every running one go in one `multiple` ack, one behind
//!   a slower delivery goes alone after 20 ms. An undecodable message, or
//!   one of another topic routed to the queue by hand, becomes a dead
//!   letter, never a crash.
//! - **Ordering keys**: the relay publishes a key's messages one at a time,
//!   in order (the next once the one before is confirmed; other keys share
//!   the window meanwhile), to each handler's queue, which keeps them in
//!   order; each
//!   consumer runs a key's messages one at a time. Replicas consuming one
//!   queue may each take a message of the same key: the handler's progress
//!   in the key makes the later one wait its turn (see "Ordering keys").
//! - **Faults**: a broker restart, closed connections or a killed process
//!   pause delivery, which resumes by itself: the relay and each consumer
//!   connect again with backoff (lapin's own recovery is not relied on);
//!   unacknowledged messages come again and the inbox skips them. A
//!   connection that goes quiet is found out too: connections ask for a
//!   10 s heartbeat (`Amqp::heartbeat`, or the URL's `heartbeat`), every
//!   broker call has a deadline (`Amqp::call_deadline`, 10 s; a publish's
//!   confirm, `Amqp::confirm_timeout`), and a consumer's periodic depth
//!   reading notices a silent broker even when no message comes. A call
//!   past its deadline gives its connection up, and every connection given
//!   up — a timed-out attempt, a replaced link — has its socket closed.
//! - **Figures**: `BusMetrics::broker` (publishes awaiting confirms per
//!   outbox and the most at once against the window, each consumer's in-flight messages and queue depth, sampled
//!   every scan interval with a passive declare, reconnects), exported as
//!   `tickbox_amqp_unconfirmed`, `tickbox_amqp_in_flight`,
//!   `tickbox_amqp_queue_depth`, `tickbox_amqp_reconnects_total`, and the
//!   broker calls given up at their deadline, `tickbox_amqp_calls_timed_out_total`. The
//!   broker's URL is shown with its password redacted everywhere.
//! - An outbox moved from in-process delivery to the broker keeps the
//!   subscriptions its local handlers recorded: retire them
//!   ([`ModuleHandle::retire_subscription`]) once their services consume
//!   from the broker, or their messages wait for them.
//!
//! # When the network goes quiet
//!
//! A connection can go silent without failing: a failover that moves the
//! server's address, a NAT or load-balancer entry that expires, a host that
//! dies without a word. Nothing then tells the client; a query waits for
//! an answer that never comes, and the server keeps the session's locks.
//! tickbox does not wait for ever:
//!
//! - **Every database call has a deadline** (`store/deadline`): tickbox's
//!   own statements (claims, marks, scans, the subscriptions' upkeep, the
//!   gauges, the operator's queries) [`ModuleBuilder::call_deadline`], 10 s
//!   by default, from the checkout on; a transaction of application code
//!   or a delivery, BEGIN to COMMIT,
//!   [`ModuleBuilder::transaction_deadline`], 30 s, or the handler's own
//!   ([`HandlerOptions::deadline`]); opening and migrating
//!   [`ModuleBuilder::migration_deadline`], 5 minutes. Half way, a warning
//!   names the module, the operation and the wait, and the call counts in
//!   `tickbox_database_calls_stuck`. At the deadline the call fails with
//!   [`Error::Deadline`], a transient failure (a delivery is retried
//!   without using up an attempt; a scan or a mark runs again), and its
//!   connection is closed, never returned to the pool — with the pool's
//!   idle connections, which most likely went the same way
//!   ([`CallMetrics`], `tickbox_database_deadlines_missed_total`).
//! - **The server lets go too** (PostgreSQL): each session of a module's
//!   pool is told to end a transaction idle for longer than the module's
//!   longest transaction deadline plus 5 s
//!   (`idle_in_transaction_session_timeout`), and a statement running that
//!   long (`statement_timeout`), so the locks of a client that vanished are
//!   released; the session that migrates ends once idle past the migration
//!   deadline, releasing the migration lock.
//! - **The kernel helps** where it can: connections get TCP keepalive
//!   (idle 10 s, every 5 s, 3 probes) and a TCP user timeout of 20 s, and a
//!   connection attempt (greeting and authentication included) gets 10 s,
//!   unless the URL sets its own (`keepalives_idle`, `keepalives_interval`,
//!   `keepalives_retries`, `tcp_user_timeout`, `connect_timeout`). A path
//!   that stays open but silent (a proxy or a NAT answering for a vanished
//!   server) is found by the deadlines alone.
//! - **The listener checks its connection**: the bus's LISTEN connection
//!   asks a question every 10 s and reconnects when no answer comes.
//! - **Stopping is bounded**: [`BusHandle::stop`] returns within
//!   [`BusBuilder::stop_timeout`] however dead the connections; what was in
//!   flight was not committed and is delivered again later.
//!
//! With the defaults, a process whose network was silent for 25 s commits
//! new work about 5 s after it returns (the `quiet_network` process tests
//! run minishop through a fault proxy and check it).
//!
//! # External effects
//!
//! An external call (an e-mail, a payment, an HTTP request) is not part of
//! the delivery's transaction; [`Delivery::effect`] makes it through the
//! module's effects journal instead. The effect is recorded as started in a
//! short transaction of its own before the call, then as succeeded with its
//! result or failed; a redelivered message gets a recorded result back
//! without calling again. A call cut short by a crash is called again with
//! the same idempotency key within its key's window
//! ([`EffectPolicy::at_least_once_with_key`]) or becomes unknown and is
//! dead-lettered ([`EffectPolicy::at_most_once`]) for a person to settle
//! ([`ModuleHandle::settle_effect`], [`Settlement`]). The journal is the
//! `tickbox_effects` table: in the module's schema on PostgreSQL (written
//! through two connections of its own), in a companion file
//! (`<database file>-effects`) on SQLite, whose write transactions hold the
//! whole file. Unknown effects show in [`HandlerMetrics::unknown_effects`],
//! [`StoreStats::unknown_effects`] and the operator's tool; what the
//! effects did, in [`ModuleMetrics::effects`].
//!
//! # Features
//!
//! - `sqlite` (default): the embedded backend, `Sqlite`; SQLite is
//!   compiled in, nothing to install.
//! - `postgres`: the production backend, `Postgres`, through
//!   tokio-postgres (no libpq).
//! - `mysql`: MariaDB (≥ 10.6) and MySQL (≥ 8.0), one build for both:
//!   `Mysql`, through diesel-async's mysql_async connection (pure Rust, no
//!   libmysqlclient); `mysql://` URLs. See "MariaDB and MySQL" below.
//! - `amqp`: the RabbitMQ transport, `Amqp`, through lapin (tokio).
//! - `tls`: encrypted, verified connections on rustls (the *ring*
//!   provider; no OpenSSL): PostgreSQL's `sslmode`, `sslrootcert`, `sslcert`
//!   and `sslkey` as libpq reads them (`verify-full` checks the chain and
//!   the host's name; without `sslrootcert`, the system's trusted roots),
//!   MariaDB's and MySQL's `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key` as
//!   the `mysql` client spells them (`REQUIRED`, `VERIFY_IDENTITY`;
//!   `PREFERRED`, the default, connects in clear; `VERIFY_CA` is refused,
//!   mysql_async 0.37 being unable to check a chain without its name),
//!   and `amqps://` with RabbitMQ's `cacertfile`, `certfile` and `keyfile`
//!   (the broker's chain and name are always checked). Without it, a URL
//!   that requires TLS is refused at start, naming the feature.
//! - `opentelemetry`: one trace from the span that published a message
//!   through every handler, across restarts, processes and the broker
//!   (see "Tracing across modules" in the README): the W3C trace context
//!   of the current span is stored with each outbox row (and dead letter),
//!   sent over RabbitMQ as `traceparent`/`tracestate` headers, and becomes
//!   the parent of the handler's `process` span; spans are named and
//!   attributed as OpenTelemetry's messaging conventions (1.42.0) say. It
//!   brings the OpenTelemetry API and tracing-opentelemetry, no SDK or
//!   exporter: the application installs those. Without it, nothing is
//!   captured or read (the column stays, unused).
//! - `testing`: the test kit for applications ([`testing`]): tracked
//!   sessions that end when a whole flow is done, and throw-away databases.
//! - `prometheus`: `install_prometheus`, an HTTP endpoint serving the
//!   metrics in Prometheus's text format. Without it, metrics still go
//!   through the [`metrics`](::metrics) facade to any recorder the
//!   application installs.
//!
//! # MariaDB and MySQL
//!
//! A module's tables live in a database of their own on the server: the one
//! [`ModuleBuilder::schema`] names (created if missing, in `utf8mb4`), or
//! else the URL's (`mysql://user:password@host:3306/orders`). What differs
//! from PostgreSQL:
//!
//! - No notifications: a commit hands its messages to the buses of its own
//!   process in memory; another process's commits are found by the bus's
//!   periodic scan ([`BusBuilder::scan_interval`]), as on SQLite.
//! - Every connection runs at READ COMMITTED (the servers' default,
//!   REPEATABLE READ, takes gap locks on the inbox's insert and the claims)
//!   and in strict mode. Deadlocks (1213) and lock wait timeouts (1205) are
//!   transient ([`Error::is_transient`]): the delivery is tried again.
//! - Claims read `FOR UPDATE SKIP LOCKED`: where the server keeps a binary
//!   log, set `binlog_format=ROW` (under `STATEMENT` or `MIXED` MariaDB
//!   warns that every claim is unsafe to log).
//! - Names and keys are bytes (`VARBINARY`), compared exactly as on the
//!   other backends, and have widths: topics, module, handler, effect and
//!   publisher names up to 255 bytes, ordering keys up to 512. A longer one
//!   is refused with an error that names it, never cut.
//! - DDL commits on its own, so migrations are not one transaction: a lock
//!   per database keeps processes starting together from migrating twice,
//!   and one attaching meanwhile from seeing a half-made database.
//! - mysql_async would move a TCP connection to a local server over to its
//!   Unix socket; tickbox adds `prefer_socket=false` unless the URL sets it,
//!   so the connection goes where the URL says.
//! - When a client goes quiet mid-transaction, MariaDB rolls its
//!   transaction back and ends its session once it has been idle for the
//!   module's longest transaction deadline plus 5 s
//!   (`idle_transaction_timeout`, set on tickbox's sessions), so its locks
//!   do not outlive it for long. MySQL 8 has no such setting: there the
//!   server's own `wait_timeout` ends it; lower it where that matters.
//!
//! # Adding a backend
//!
//! A backend is one folder of `src/store/` (`sqlite/`, `postgres/`,
//! `mysql/`): a type implementing [`Backend`], how it opens, migrates and
//! pools its connections, and one file per concept (`outbox`, `inbox`,
//! `subscriptions`, `ordering`, `journal`, `dead_letters`, `retention`,
//! `catalog`, `scratch`) implementing that concept's statements. Each
//! statement is a named operation documented once on its concept's trait
//! (`src/store/<concept>.rs`); where standard SQL serves, the trait's default
//! states it and the backend states only what its dialect spells
//! differently. Add its migrations under `migrations/<backend>/`, a Cargo
//! feature, its lines in the registry of `src/store/mod.rs`, and one
//! `suite!` line in `tests/lib.rs` to run the whole suite on it. The MariaDB
//! backend was added that way: its commit touches no generic file.
//!
//! # Layout
//!
//! One concept per file or folder of `src/`, listed in layer order: each
//! uses only concepts above it in this list (its arrows), never one below,
//! and names an item through the module that defines it, not through the
//! crate root. `lib.rs` only declares, documents and re-exports. CI checks
//! both with `.ci/layers`, which reads every `crate::` path and this list.
//!
//! - `error` — [`Error`] and [`Result`]; `outcome`: how a delivery ends
//!   ([`Outcome`], [`DeliveryError`], [`FailureKind`]), which
//!   [`Error::ReplayFailed`] carries.
//! - `trace/` — trace context across modules (feature `opentelemetry`):
//!   `context` (the W3C context a message carries, `TraceContext`),
//!   `spans` (the messaging spans, as OpenTelemetry's conventions name
//!   them).
//! - `message` — [`Message`], [`Envelope`], [`Keyed`]. Uses: error, trace.
//! - `retry` — [`RetryPolicy`]. Uses: error.
//! - `retention` — [`Retention`], [`SweepReport`]. Uses: error, retry.
//! - `redact` — hiding passwords in the URLs tickbox shows, and the URLs it
//!   keeps, which show themselves redacted.
//! - `send_async_fn` — the async closures transactions and calls take.
//! - `tls/` — what a URL asks of TLS (`postgres`: libpq's knobs and the
//!   connector tokio-postgres negotiates through; `mysql`: the `mysql`
//!   client's knobs and mysql_async's options; `amqp`: `amqps://`), the
//!   rustls configuration that gives it, and failed handshakes in plain
//!   words (`config`).
//! - `store/` — storage, and the only place that writes SQL: `contract`
//!   (what a backend is), one file per concept declaring its statements
//!   (`outbox`, `subscriptions` with the recorded [`Subscription`],
//!   `inbox`, `ordering`, `journal`, `dead_letters`, `retention`,
//!   `catalog`, `scratch`), one folder per backend (`sqlite/`, `postgres/`,
//!   `mysql/`), `backend` ([`Backend`]), `schema`, `database` (a module's
//!   pool, its calls and write turn), `deadline`, `settings`, `pool`,
//!   `migrations`. Uses: error, message, redact, send_async_fn, tls, trace.
//! - `transient` — which failures are worth trying again
//!   ([`Error::is_transient`]). Uses: error, store.
//! - `effects/` — external effects' policy, state, journal, scope, records
//!   and counters ([`EffectPolicy`], [`EffectRecord`], [`EffectMetrics`]).
//!   Uses: error, message, store.
//! - `tracking` — what a module did, told to the test kit's sessions
//!   (nothing without the `testing` feature). Uses: error, message.
//! - `metrics` — counters, gauges and histograms, their snapshots
//!   ([`BusMetrics`], with a broker's figures), and their exported names.
//!   Uses: effects, store.
//! - `outbox/` — a module's outbox as this process sees it: what it may
//!   publish, the hand-over of committed messages to a bus, who claims
//!   them; `subscription` (whom it owes its messages to), `watchdog`,
//!   `clock` (the time scheduled messages are due by).
//!   Uses: error, message, metrics, store, tracking.
//! - `tx` — [`Tx`], a module transaction: writes what it publishes to the
//!   outbox at COMMIT. Uses: error, message, outbox, store, trace.
//! - `delivery/` — a message meets a handler: `handler` ([`Handler`],
//!   [`Delivery`], [`HandlerOptions`]), `effect` (the work behind
//!   [`Delivery::effect`]), `guard` (the inbox guard), `batch`,
//!   `batch_queue`, `registry` (a module's registered handlers), `attempt`.
//!   Uses: effects, error, message, metrics, outbox, retry, store,
//!   trace, transient, tx.
//! - `module/` — [`Module`]: `builder` ([`ModuleBuilder`]), `core` (its
//!   parts), `actor` (runs deliveries), `handle` ([`ModuleHandle`], its
//!   whole API in one `impl`), and the work behind some of the handle's
//!   methods: `subscriptions` (retiring one), `sweep` (retention),
//!   `dead_letters` ([`DeadLetter`]), `scheduled` ([`Scheduled`]). Uses:
//!   delivery, effects, error, message, metrics, outbox, redact,
//!   retention, send_async_fn, store, trace, tx.
//! - `bus/` — [`Bus`]: `builder` ([`BusBuilder`]), `config`, `core`,
//!   `actor`, `handle` ([`BusHandle`]), `dispatcher` (one per outbox),
//!   `attempts` (retries and dead letters along a route), `lanes` (a key's
//!   messages one at a time per route), `route` (where a message leaves the
//!   bus: a handler here, or the broker), `transport` (the interface a
//!   broker implements: the only part of the bus a broker uses),
//!   `duplicates` (a test hook). Uses: delivery, error, message, metrics,
//!   module, outbox, retry, store.
//! - `amqp/` — RabbitMQ as the bus's broker (feature `amqp`): `settings`
//!   (`Amqp`), `transport` (the bus's interface, implemented), `link`,
//!   `topology`, `wire`, `relay`, `consumer`, `acks`, `state`, `fault`.
//!   Uses: bus (its `transport` only), error, message, metrics, redact,
//!   tls, trace.
//! - `testing/` — the test kit (feature `testing`): `session`
//!   ([`testing::Session`]), `report`, `databases`
//!   ([`testing::TestDatabases`]). Uses: bus, error, message, module,
//!   outbox, retry, store, tracking.
//! - `prometheus` — the exporter (feature `prometheus`). Uses: error,
//!   metrics.
//!
//! The operator's command-line tool, `tickbox` (status, subscriptions, dead
//! letters, effects, retention sweep), is the workspace crate `tools/tickbox-cli`,
//! built on [`ModuleBuilder::attach`]: `cargo run -p tickbox-cli -- help`.

#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

#[cfg(feature = "amqp")]
mod amqp;
mod bus;

mod delivery;
mod effects;
mod error;
mod message;
mod metrics;
mod module;
mod outbox;
#[cfg(feature = "prometheus")]
mod prometheus;
/// Secrets kept out of what tickbox shows. Not part of the API: the
/// operator's tool and the examples show URLs the way tickbox does through
/// `tickbox::redact::redact_url`.
#[doc(hidden)]
pub mod redact;
mod retention;
mod retry;
mod send_async_fn;
mod store;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;
// Only servers reached over a network speak TLS.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "amqp"))]
mod tls;
#[cfg(feature = "opentelemetry")]
mod trace;
mod tracking;
mod transient;
mod tx;

/// The diesel tickbox is built on (2.4). Handlers and transactions run an
/// application's queries on its connections, so the application depends on
/// the same version; a crate that declares tables needs diesel as a direct
/// dependency (`diesel::table!` expands to `diesel::` paths), and this
/// re-export serves for traits and functions.
pub use diesel;
/// The diesel-async tickbox is built on (0.10), re-exported like
/// [`diesel`].
pub use diesel_async;
/// The diesel_migrations tickbox is built on, for
/// [`ModuleBuilder::migrations`]: `use tickbox::diesel_migrations;` then
/// `diesel_migrations::embed_migrations!("…")`.
pub use diesel_migrations;

pub use bus::actor::Bus;
pub use bus::builder::BusBuilder;
pub use bus::handle::BusHandle;
pub use delivery::handler::{Delivery, Handler, HandlerError, HandlerOptions};
pub use effects::counters::EffectMetrics;
pub use effects::policy::EffectPolicy;
pub use effects::record::{EffectRecord, Settlement};
pub use effects::state::EffectState;
pub use error::outcome::{DeliveryError, FailureKind, Outcome};
pub use error::{Error, Result};
pub use message::{Envelope, Keyed, Message};
pub use metrics::{
    BrokerMetrics, BusMetrics, ConsumerMetrics, HandlerMetrics, LatencyMetrics, ModuleMetrics,
    OutboxMetrics, RelayMetrics,
};
pub use module::actor::Module;
pub use module::builder::ModuleBuilder;
pub use module::dead_letters::{DeadLetter, Replayed};
pub use module::handle::{ModuleHandle, StoreStats};
pub use module::scheduled::Scheduled;
pub use retention::{Retention, SweepReport};
pub use retry::RetryPolicy;
pub use store::backend::{Backend, Schemas};
pub use store::deadline::CallMetrics;
pub use store::subscriptions::Subscription;
pub use tx::Tx;

#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use amqp::settings::Amqp;
#[cfg(feature = "amqp")]
#[cfg_attr(docsrs, doc(cfg(feature = "amqp")))]
pub use amqp::topology::QueueStatus;
#[cfg(feature = "prometheus")]
#[cfg_attr(docsrs, doc(cfg(feature = "prometheus")))]
pub use prometheus::{install_prometheus, PrometheusExporter};
pub use store::backends::*;
#[cfg(feature = "opentelemetry")]
#[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
pub use trace::context::TraceContext;
