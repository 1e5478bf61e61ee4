//! The report at the end of a run: on stdout as text, or with `--json` as
//! one JSON object and nothing else.
//!
//! It keeps apart what this run did (from the bus's in-memory counters,
//! since this process started) and what the databases hold (every run's
//! work, which the check reads). Over amqp a process may see only some of
//! the databases: what it did not see is `null` in the JSON object and
//! named as not checked in the text, never counted as fine.

use crate::check::{self, Problem};
use crate::cli::Args;
use crate::db::ShopDb;
use crate::disturb::{self, Disturbance};
use crate::flow::{self, Drain};
use crate::Shop;
use comfy_table::{CellAlignment, LineStyle, Table, TableStyle};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tickbox::{BusHandle, BusMetrics, LatencyMetrics, StoreStats};

/// What the run counts while it runs, for [`ThisRun`].
pub struct Figures {
    /// New orders to place, and placed so far.
    pub to_place: u64,
    pub placed: u64,
    /// How long placing them took.
    pub place_seconds: f64,
    /// With `--disturb`, the disturbing messages delivered.
    pub disturbed: Option<Vec<Disturbance>>,
    /// When the run started, and when its bus did.
    started: Instant,
    waited: Instant,
}

impl Figures {
    /// A run that started at `started` and whose bus has just started.
    pub fn new(args: &Args, started: Instant) -> Self {
        Figures {
            to_place: args.orders(),
            placed: 0,
            place_seconds: 0.0,
            disturbed: None,
            started,
            waited: Instant::now(),
        }
    }
}

impl Report {
    /// The report of a run whose bus has stopped: what the bus counted, and
    /// what the databases seen here hold, read now.
    pub async fn read<B: ShopDb>(
        shop: &Shop<B>,
        bus: &BusHandle<B>,
        args: &Args,
        figures: Figures,
        drain: Drain,
    ) -> tickbox::Result<Report> {
        let drain_seconds = figures.waited.elapsed().as_secs_f64() - figures.place_seconds;
        let snapshot = check::Snapshot::read(shop).await?;
        let stores = flow::store_stats(shop).await?;
        let metrics = bus.metrics();
        // The bus samples its queues' depths while it runs; the report gives
        // them as they are now, after the drain.
        #[cfg(feature = "amqp")]
        let depths_at_end = match &metrics.broker {
            Some(amqp) => Broker::read_depths(&crate::shop::broker(args), amqp).await,
            None => Vec::new(),
        };
        let disturbed = figures.disturbed;
        Ok(Report {
            backend: B::NAME,
            modules: args.module_names(),
            all_modules: args.runs_all(),
            seen: shop.seen().iter().map(|(name, _)| *name).collect(),
            broker: args.over_amqp().then(|| Broker {
                url: tickbox::redact::redact_url(&args.amqp_url),
                namespace: args.amqp_namespace.clone(),
                exchange: format!("tickbox.{}", args.amqp_namespace),
                #[cfg(feature = "amqp")]
                metrics: metrics.broker.clone(),
                #[cfg(feature = "amqp")]
                depths_at_end,
            }),
            run: ThisRun {
                placed: figures.placed,
                to_place: figures.to_place,
                metrics: final_metrics(metrics, &stores),
                place_seconds: figures.place_seconds,
                drain_seconds,
                total_seconds: figures.started.elapsed().as_secs_f64(),
            },
            databases: Databases {
                orders: snapshot.orders.as_ref().map(Vec::len),
                reservations: snapshot.reservations.as_ref().map(Vec::len),
                confirmations: snapshot.confirmations(),
                rejected: snapshot.rejected(),
                timed_out: snapshot.timed_out(),
                emails: snapshot.emails.as_ref().map(Vec::len),
                emails_sent: snapshot.mail.as_ref().map(|mail| mail.sent),
                effects_unknown: snapshot.mail.as_ref().map(|mail| mail.unknown),
                awaiting_a_person: snapshot
                    .mail
                    .as_ref()
                    .map_or(0, |mail| mail.awaiting_a_person.len()),
                pending: stores.iter().map(|(_, s)| s.outbox_pending).sum(),
                dead_letters: stores.iter().map(|(_, s)| s.dead_letters).sum(),
            },
            problems: check::verify(&snapshot)
                .into_iter()
                .chain(disturbed.as_deref().and_then(disturb::applied))
                .collect(),
            ignored: Ignored {
                saga: snapshot.saga_ignored,
                warehouse: snapshot.warehouse_ignored,
            },
            disturbed,
            drain,
        })
    }
}

/// Prints the report of a run, or why there is none, and gives the exit
/// code: the report's own, or 1 (130 when interrupted).
pub fn finish(result: Result<Report, String>, json: bool, interrupted: bool) -> ExitCode {
    match result {
        Ok(report) if json => {
            println!("{}", report.json());
            report.exit_code()
        }
        Ok(report) => {
            report.print();
            report.exit_code()
        }
        Err(error) => {
            print_error(&error, json);
            if interrupted {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// What a run found.
#[derive(Debug)]
pub struct Report {
    pub backend: &'static str,
    /// The modules whose handlers ran here, and whether that is all of
    /// them.
    pub modules: Vec<&'static str>,
    pub all_modules: bool,
    /// The modules whose databases were read for the check.
    pub seen: Vec<&'static str>,
    /// Over amqp, the broker and its figures.
    pub broker: Option<Broker>,
    pub run: ThisRun,
    pub databases: Databases,
    pub problems: Vec<Problem>,
    /// Messages the handlers' own checks ignored, beyond the inbox.
    pub ignored: Ignored,
    /// With `--disturb`, the disturbing messages delivered and what became
    /// of each.
    pub disturbed: Option<Vec<Disturbance>>,
    pub drain: Drain,
}

/// What this run did.
#[derive(Debug)]
pub struct ThisRun {
    /// New orders placed, and asked to place.
    pub placed: u64,
    pub to_place: u64,
    /// The bus's metrics at the end, the outbox gauges read after it
    /// stopped.
    pub metrics: BusMetrics,
    pub place_seconds: f64,
    pub drain_seconds: f64,
    pub total_seconds: f64,
}

/// What the databases seen here hold, over every run: `None` for a
/// database not seen.
#[derive(Debug)]
pub struct Databases {
    pub orders: Option<usize>,
    pub reservations: Option<usize>,
    pub confirmations: Option<i64>,
    /// Orders rejected for want of stock.
    pub rejected: Option<usize>,
    /// Orders cancelled by their timeout (`--confirm-within`).
    pub timed_out: Option<usize>,
    pub emails: Option<usize>,
    /// E-mails the SMTP server accepted (`--smtp`), as far as the
    /// notifications module's effects journal knows: its succeeded
    /// `send_confirmation` effects.
    pub emails_sent: Option<usize>,
    /// Effects in that journal nobody can vouch for: a person settles them.
    pub effects_unknown: Option<usize>,
    /// Dead letters of e-mails unknown under at-most-once: the policy's
    /// expected outcome of a crash, waiting for a person, not a failure of
    /// the run.
    pub awaiting_a_person: usize,
    /// Outbox messages not yet delivered to every subscriber (over amqp:
    /// not yet confirmed by the broker), in the outboxes seen.
    pub pending: i64,
    pub dead_letters: i64,
}

/// Messages a handler did not apply because they did not fit what its
/// database holds, recorded in the database's `ignored_messages`, per
/// reason: `None` for a database not seen.
#[derive(Debug)]
pub struct Ignored {
    /// By the orders saga: answers for an order settled already, or for
    /// no such order.
    pub saga: Option<Vec<(String, i64)>>,
    /// By the warehouse: an order placed again after it was answered.
    pub warehouse: Option<Vec<(String, i64)>>,
}

impl Ignored {
    /// How many messages one module ignored.
    fn total(per_reason: &Option<Vec<(String, i64)>>) -> Option<i64> {
        Some(per_reason.as_ref()?.iter().map(|(_, n)| n).sum())
    }

    /// Reason → count, as a JSON object.
    fn json(per_reason: &Option<Vec<(String, i64)>>) -> serde_json::Value {
        match per_reason {
            Some(reasons) => reasons
                .iter()
                .map(|(reason, n)| (reason.clone(), serde_json::Value::from(*n)))
                .collect::<serde_json::Map<_, _>>()
                .into(),
            None => serde_json::Value::Null,
        }
    }

    /// One module's count, with its reasons, as text.
    fn text(per_reason: &Option<Vec<(String, i64)>>) -> String {
        match (Ignored::total(per_reason), per_reason) {
            (Some(0), _) => "0".into(),
            (Some(total), Some(reasons)) => {
                let reasons: Vec<String> = reasons
                    .iter()
                    .map(|(reason, n)| format!("{reason}: {n}"))
                    .collect();
                format!("{total} ({})", reasons.join(", "))
            }
            _ => "(not seen)".into(),
        }
    }
}

/// The broker a run over amqp used.
#[derive(Debug)]
pub struct Broker {
    /// Its URL, the password hidden.
    pub url: String,
    pub namespace: String,
    pub exchange: String,
    /// The bus's figures at the end (`BusMetrics::broker`).
    #[cfg(feature = "amqp")]
    pub metrics: Option<tickbox::BrokerMetrics>,
    /// Each handler's queue depth as the broker reported it after the
    /// drain, by queue (`None`: it could not be read). The report shows
    /// these rather than the bus's own figure, a sample taken while it ran
    /// (every scan interval), which may predate the drain.
    #[cfg(feature = "amqp")]
    pub depths_at_end: Vec<(String, Option<u64>)>,
}

impl Broker {
    /// Reads the depth of each handler's queue in `metrics` from the broker
    /// now, after the drain.
    #[cfg(feature = "amqp")]
    pub async fn read_depths(
        amqp: &tickbox::Amqp,
        metrics: &tickbox::BrokerMetrics,
    ) -> Vec<(String, Option<u64>)> {
        let mut depths = Vec::new();
        for c in &metrics.consumers {
            let depth = match amqp.queue_status(&c.module, &c.handler).await {
                Ok(status) => Some(u64::from(status.messages)),
                Err(error) => {
                    tracing::warn!(queue = %c.queue, %error, "reading the queue's depth at the end failed");
                    None
                }
            };
            depths.push((c.queue.clone(), depth));
        }
        depths
    }

    /// The depth of `queue` after the drain, if it was read.
    #[cfg(feature = "amqp")]
    fn depth_at_end(&self, queue: &str) -> Option<u64> {
        self.depths_at_end
            .iter()
            .find(|(name, _)| name == queue)
            .and_then(|(_, depth)| *depth)
    }

    /// Sets `queue_depth` of each consumer of `consumers` (a JSON array of
    /// `ConsumerMetrics`) to its depth after the drain, or null.
    #[cfg(feature = "amqp")]
    fn with_depths_at_end(&self, consumers: &mut serde_json::Value) {
        for consumer in consumers.as_array_mut().into_iter().flatten() {
            let queue = consumer["queue"].as_str().unwrap_or_default().to_string();
            consumer["queue_depth"] = self.depth_at_end(&queue).into();
        }
    }

    fn json(&self) -> serde_json::Value {
        #[cfg_attr(not(feature = "amqp"), allow(unused_mut))]
        let mut json = serde_json::json!({
            "url": self.url,
            "namespace": self.namespace,
            "exchange": self.exchange,
        });
        #[cfg(feature = "amqp")]
        if let (Some(m), Some(object)) = (&self.metrics, json.as_object_mut()) {
            object.insert("reconnects".into(), m.reconnects.into());
            let unconfirmed = serde_json::to_value(&m.unconfirmed).unwrap_or_default();
            let mut consumers = serde_json::to_value(&m.consumers).unwrap_or_default();
            self.with_depths_at_end(&mut consumers);
            object.insert("unconfirmed".into(), unconfirmed);
            object.insert("consumers".into(), consumers);
        }
        json
    }

    fn print(&self) {
        println!("The broker {} (exchange {}):", self.url, self.exchange);
        #[cfg(feature = "amqp")]
        if let Some(m) = &self.metrics {
            let unconfirmed: Vec<String> = m
                .unconfirmed
                .iter()
                .map(|r| format!("{} {}", r.module, r.unconfirmed))
                .collect();
            println!(
                "  {} reconnects; publishes waiting for a confirm: {}",
                m.reconnects,
                if unconfirmed.is_empty() {
                    "-".to_string()
                } else {
                    unconfirmed.join(", ")
                }
            );
            let mut consumers = table(&["queue", "in flight", "depth at the end"]);
            for c in &m.consumers {
                consumers.add_row(vec![
                    c.queue.clone(),
                    c.in_flight.to_string(),
                    self.depth_at_end(&c.queue)
                        .map_or_else(|| "-".to_string(), |depth| depth.to_string()),
                ]);
            }
            println!();
            println!("{consumers}");
        }
    }
}

impl Report {
    /// The run finished, nothing is pending, the check found no problem,
    /// and there are no dead letters but those of e-mails unknown under
    /// at-most-once (each waiting for a person to settle it).
    pub fn ok(&self) -> bool {
        self.drain == Drain::Finished
            && self.databases.pending == 0
            && self.databases.dead_letters == self.databases.awaiting_a_person as i64
            && self.problems.is_empty()
    }

    fn interrupted(&self) -> bool {
        self.drain == Drain::Interrupted
    }

    /// Problems that are not just work left to do: something done twice,
    /// or done without its cause.
    fn broken(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| !p.unfinished)
    }

    /// What the check established, from the databases seen (when it
    /// passed).
    fn verified(&self) -> Vec<&'static str> {
        let seen = |name| self.seen.contains(&name);
        let mut verified = Vec::new();
        if seen("orders") {
            verified.push(
                "every order was confirmed exactly once, or rejected, or cancelled by its timeout \
                 (not before its deadline)",
            );
        }
        if seen("warehouse") {
            verified.push(if seen("orders") {
                "every order has exactly one reservation, the stock taken matches them"
            } else {
                "no order has two reservations, the stock taken matches them"
            });
        }
        if seen("notifications") {
            verified.push(if seen("orders") {
                "every order has exactly one e-mail"
            } else {
                "no order has two e-mails"
            });
        }
        verified.push(
            "every message this process's handlers received was handled (their queues drained, \
             no dead letter) and its outboxes hold nothing pending",
        );
        verified
    }

    /// 0 when the check passed; 130 when interrupted with nothing broken;
    /// 1 otherwise.
    pub fn exit_code(&self) -> ExitCode {
        if self.ok() {
            ExitCode::SUCCESS
        } else if self.interrupted() && self.broken().next().is_none() {
            ExitCode::from(130)
        } else {
            ExitCode::FAILURE
        }
    }

    /// Whether the three databases were seen, so the whole flow checked.
    fn whole_flow(&self) -> bool {
        self.seen.len() == 3
    }

    /// The result as one JSON object. `ok`, `placed` and the databases'
    /// totals (`orders`, `reservations`, `confirmations`, `rejected`,
    /// `timed_out` (orders cancelled by their `--confirm-within` timeout),
    /// `emails` (rows in `sent_emails`), `emails_sent` (e-mails the SMTP
    /// server accepted, as far as the notifications module's effects
    /// journal knows: 0 without `--smtp`), `effects_unknown` (effects in
    /// that journal nobody can vouch for), `pending`, `dead_letters`, and
    /// the messages the handlers' own checks ignored, `saga_ignored` and
    /// `warehouse_ignored`; `null` for a database not seen here) are at the
    /// top, where scripts read them. `ok` is true when the run finished,
    /// nothing is pending, the check found no problem (see
    /// `check::verify`), and every dead letter is that of an e-mail
    /// unknown under `--email-policy at-most-once` (then `emails_sent +
    /// effects_unknown` is the confirmed orders, and those orders have no
    /// e-mail row: the policy's promise, kept, with a person to settle
    /// each); `ignored` gives those per module and reason, `disturbed`
    /// (with `--disturb`, else `null`) each disturbing message delivered; `checked` names the databases
    /// read and `whole_flow` whether that is all three; `this_run` holds
    /// this run's counters, `metrics` the bus's final metrics snapshot
    /// (`BusMetrics`) and, over amqp, `amqp` the broker (its URL without
    /// the password) and its figures (reconnects, publishes unconfirmed per
    /// outbox, each queue's depth and messages in flight).
    pub fn json(&self) -> serde_json::Value {
        let (run, db, m) = (&self.run, &self.databases, &self.run.metrics);
        serde_json::json!({
            "ok": self.ok(),
            "backend": self.backend,
            "modules": self.modules,
            "transport": if self.broker.is_some() { "amqp" } else { "local" },
            "checked": self.seen,
            "whole_flow": self.whole_flow(),
            "placed": run.placed,
            "orders": db.orders,
            "reservations": db.reservations,
            "confirmations": db.confirmations,
            "rejected": db.rejected,
            "timed_out": db.timed_out,
            "emails": db.emails,
            "emails_sent": db.emails_sent,
            "effects_unknown": db.effects_unknown,
            "pending": db.pending,
            "dead_letters": db.dead_letters,
            "saga_ignored": Ignored::total(&self.ignored.saga),
            "warehouse_ignored": Ignored::total(&self.ignored.warehouse),
            "ignored": {
                "orders": Ignored::json(&self.ignored.saga),
                "warehouse": Ignored::json(&self.ignored.warehouse),
            },
            "disturbed": self.disturbed,
            "drained": self.drain == Drain::Finished,
            "interrupted": self.interrupted(),
            "unfinished": match &self.drain {
                Drain::TimedOut(what) => Some(what),
                _ => None,
            },
            "problems": self.problems.iter().map(|p| &p.text).collect::<Vec<_>>(),
            "this_run": {
                "placed": run.placed,
                "to_place": run.to_place,
                "handled": m.total(|h| h.handled),
                "duplicates_skipped": m.total(|h| h.duplicates_skipped),
                "duplicates_injected": m.duplicates_injected,
                "failed": m.total(|h| h.failed),
                "retries": m.total(|h| h.retried),
                "dead_lettered": m.total(|h| h.dead_lettered),
                "delivered": m.delivered,
                "place_seconds": run.place_seconds,
                "drain_seconds": run.drain_seconds,
                "total_seconds": run.total_seconds,
            },
            "metrics": self.metrics_json(),
            "amqp": self.broker.as_ref().map(Broker::json),
        })
    }

    /// The bus's final metrics as JSON, over amqp with each queue's depth
    /// read after the drain in place of the bus's last sample.
    fn metrics_json(&self) -> serde_json::Value {
        #[cfg_attr(not(feature = "amqp"), allow(unused_mut))]
        let mut metrics = serde_json::to_value(&self.run.metrics).unwrap_or_else(
            |e| serde_json::json!({ "error": format!("the metrics did not serialize: {e}") }),
        );
        #[cfg(feature = "amqp")]
        if let (Some(broker), Some(consumers)) = (
            &self.broker,
            metrics
                .get_mut("amqp")
                .and_then(|amqp| amqp.get_mut("consumers")),
        ) {
            broker.with_depths_at_end(consumers);
        }
        metrics
    }

    /// The report as text.
    pub fn print(&self) {
        let (run, db, m) = (&self.run, &self.databases, &self.run.metrics);
        let verdict = if self.ok() {
            "OK"
        } else if self.interrupted() {
            "INTERRUPTED"
        } else {
            "FAILED"
        };
        println!("MiniShop on {}: {verdict}", self.backend);
        if !self.all_modules {
            println!(
                "  ran the handlers of {} here; the rest run in other processes",
                self.modules.join(", ")
            );
        }

        println!();
        println!("This run ({:.2} s):", run.total_seconds);
        if run.to_place == 0 {
            println!(
                "  placed no orders, waited {:.2} s for the flow",
                run.drain_seconds
            );
        } else {
            println!(
                "  placed {} of {} new orders in {:.2} s, then waited {:.2} s for the flow",
                run.placed, run.to_place, run.place_seconds, run.drain_seconds
            );
        }
        println!(
            "  {} handled, {} duplicates skipped ({} injected), {} failed attempts, {} retries, \
             {} dead-lettered, {} messages delivered",
            m.total(|h| h.handled),
            m.total(|h| h.duplicates_skipped),
            m.duplicates_injected,
            m.total(|h| h.failed),
            m.total(|h| h.retried),
            m.total(|h| h.dead_lettered),
            m.delivered
        );
        println!();
        println!("{}", handler_table(m));
        println!();
        println!("{}", latency_table(m));
        println!("  (p50 and p99 are upper bounds: the histogram bucket each falls in)");

        println!();
        let shown = |n: Option<String>| n.unwrap_or_else(|| "(not seen)".into());
        if self.whole_flow() {
            println!("The databases (every run's work):");
        } else {
            println!(
                "The databases seen here, of {} (every run's work):",
                self.seen.join(", ")
            );
        }
        println!(
            "  {} orders, {} reservations, {} confirmations, {} rejected (for want of stock), {} \
             timed out (cancelled), {} e-mails, {} messages pending, {} dead letters",
            shown(db.orders.map(|n| n.to_string())),
            shown(db.reservations.map(|n| n.to_string())),
            shown(db.confirmations.map(|n| n.to_string())),
            shown(db.rejected.map(|n| n.to_string())),
            shown(db.timed_out.map(|n| n.to_string())),
            shown(db.emails.map(|n| n.to_string())),
            db.pending,
            db.dead_letters
        );
        if let (Some(sent), Some(unknown)) = (db.emails_sent, db.effects_unknown) {
            if sent + unknown > 0 {
                println!(
                    "  e-mails over SMTP, from the effects journal: {sent} accepted by the \
                     server, {unknown} unknown (a person settles them: tickbox effects list \
                     --state unknown)"
                );
            }
        }
        println!(
            "  messages ignored as not fitting their order: {} by the orders saga, {} by the \
             warehouse",
            Ignored::text(&self.ignored.saga),
            Ignored::text(&self.ignored.warehouse)
        );
        if let Some(disturbed) = &self.disturbed {
            println!();
            println!("{}", disturbed_table(disturbed));
        }
        println!();
        println!("{}", outbox_table(m));
        if let Some(broker) = &self.broker {
            println!();
            broker.print();
        }

        println!();
        self.print_check();
    }

    fn print_check(&self) {
        let (run, db) = (&self.run, &self.databases);
        if self.ok() && self.whole_flow() {
            let mut except = String::new();
            if let Some(rejected) = db.rejected.filter(|n| *n > 0) {
                except.push_str(&format!(
                    " ({rejected} rejected for want of stock: none of them)"
                ));
            }
            if let Some(timed_out) = db.timed_out.filter(|n| *n > 0) {
                except.push_str(&format!(
                    " ({timed_out} cancelled by their timeout, none before its deadline: no \
                     confirmation, no e-mail)"
                ));
            }
            println!(
                "Check: OK — every order has exactly one reservation, one confirmation and one \
                 e-mail{except}; no message pending"
            );
            if db.awaiting_a_person > 0 {
                println!(
                    "  except {} orders whose e-mail is unknown (at most once: a crash cut it \
                     short, and it is never sent twice): their deliveries wait as dead letters \
                     for a person (tickbox effects list --state unknown)",
                    db.awaiting_a_person
                );
            }
            return;
        }
        if self.ok() {
            println!(
                "Check: OK for what this process sees ({} database) — {}",
                self.seen.join(", "),
                self.verified().join("; ")
            );
            let unseen: Vec<&str> = ["orders", "warehouse", "notifications"]
                .into_iter()
                .filter(|name| !self.seen.contains(name))
                .collect();
            println!(
                "  not checked here: the {} database (give --check-data-dir or \
                 --check-database-url to check the whole flow)",
                unseen.join(" and ")
            );
            return;
        }
        if self.interrupted() {
            println!(
                "Check: skipped, the work is unfinished — run again with --resume to finish it \
                 (it places no new orders)"
            );
            if run.placed < run.to_place {
                println!(
                    "  - {} of the {} new orders were never placed",
                    run.to_place - run.placed,
                    run.to_place
                );
            }
            if db.pending != 0 {
                println!("  - {} outbox messages pending", db.pending);
            }
            for problem in self.problems.iter().filter(|p| p.unfinished) {
                println!("  - {}", problem.text);
            }
            if self.broken().next().is_none() {
                println!("  so far nothing was done twice or without its cause");
            } else {
                println!("FAILED even so:");
                for problem in self.broken() {
                    println!("  - {}", problem.text);
                }
            }
            return;
        }
        println!("Check: FAILED");
        if let Drain::TimedOut(what) = &self.drain {
            println!("  - the work did not finish before the deadline: {what}");
        }
        if db.pending != 0 {
            println!("  - {} outbox messages still pending", db.pending);
        }
        if db.dead_letters != db.awaiting_a_person as i64 {
            println!(
                "  - {} dead letters: deliveries given up on, waiting for an operator \
                 (ModuleHandle::dead_letters, replay_dead_letter){}",
                db.dead_letters,
                match db.awaiting_a_person {
                    0 => String::new(),
                    n => format!(", {n} of them for e-mails unknown at most once"),
                }
            );
        }
        for problem in &self.problems {
            println!("  - {}", problem.text);
        }
    }
}

/// Per handler: its counters.
fn handler_table(metrics: &BusMetrics) -> Table {
    let mut table = table(&[
        "handler",
        "handled",
        "duplicates",
        "failed",
        "retried",
        "dead-lettered",
        "batches",
        "fallbacks",
    ]);
    for h in metrics.modules.iter().flat_map(|m| &m.handlers) {
        table.add_row(vec![
            h.handler.to_string(),
            h.handled.to_string(),
            h.duplicates_skipped.to_string(),
            h.failed.to_string(),
            h.retried.to_string(),
            h.dead_lettered.to_string(),
            h.batches.to_string(),
            h.batch_fallbacks.to_string(),
        ]);
    }
    table
}

/// With `--disturb`: each disturbing message, and whether its handler
/// ignored it.
fn disturbed_table(disturbed: &[Disturbance]) -> Table {
    let mut table = table(&["disturbing message", "to", "delivery", "ignored because"]);
    for column in table.column_iter_mut() {
        column.set_cell_alignment(CellAlignment::Left);
    }
    for d in disturbed {
        table.add_row(vec![
            d.what.to_string(),
            d.handler.to_string(),
            d.outcome.clone(),
            d.ignored.clone().unwrap_or_else(|| "NOT IGNORED".into()),
        ]);
    }
    table
}

/// Per handler: the time of its transaction, and from publishing to
/// handling.
fn latency_table(metrics: &BusMetrics) -> Table {
    let mut table = table(&[
        "handler",
        "transaction p50 / p99 / mean",
        "end to end p50 / p99 / mean",
    ]);
    for h in metrics.modules.iter().flat_map(|m| &m.handlers) {
        table.add_row(vec![
            h.handler.to_string(),
            latency(&h.latency),
            latency(&h.end_to_end),
        ]);
    }
    table
}

/// Per module: its outbox. Pending and dead letters are what the databases
/// hold; delivered is this run's.
fn outbox_table(metrics: &BusMetrics) -> Table {
    let mut table = table(&["outbox", "pending", "dead letters", "delivered (this run)"]);
    for module in &metrics.modules {
        let outbox = &module.outbox;
        table.add_row(vec![
            module.module.to_string(),
            outbox.pending.to_string(),
            outbox.dead_letters.to_string(),
            outbox.delivered.to_string(),
        ]);
    }
    table
}

/// A table with a header, its first column left-aligned and the others
/// right-aligned.
fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    // A line under the header, and nothing else.
    let style = TableStyle::new().header_separator(LineStyle::none().fill('─').junction(' '));
    table.load_style(style).set_header(header);
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// `≤p50 / ≤p99 / mean` of a latency histogram, or `-` without
/// observations.
fn latency(l: &LatencyMetrics) -> String {
    if l.count == 0 {
        return "-".into();
    }
    let bound = |q: f64| {
        let b = l.quantile_upper_bound(q);
        if b.is_finite() {
            format!("≤{}", seconds(b))
        } else {
            let last = l.buckets.last().map_or(0.0, |(le, _)| *le);
            format!(">{}", seconds(last))
        }
    };
    format!(
        "{} / {} / {}",
        bound(0.5),
        bound(0.99),
        seconds(l.mean_seconds())
    )
}

fn seconds(s: f64) -> String {
    format!("{:.1?}", Duration::from_secs_f64(s.max(0.0)))
}

/// The bus's metrics snapshot, its outbox gauges brought up to date.
///
/// The gauges (pending, lag, dead letters) are what each module last
/// sampled from its database, up to a sampling interval old; the report has
/// just read the same values after the bus stopped, so those stand in for
/// the sample, as if it had been taken then.
pub fn final_metrics(mut metrics: BusMetrics, stores: &[(String, StoreStats)]) -> BusMetrics {
    let now = crate::tables::now_us();
    for module in &mut metrics.modules {
        if let Some((_, stats)) = stores.iter().find(|(name, _)| *name == module.module) {
            module.outbox.pending = stats.outbox_pending;
            module.outbox.dead_letters = stats.dead_letters;
            module.outbox.lag_seconds = stats
                .oldest_pending_us
                .map_or(0.0, |oldest| (now - oldest).max(0) as f64 / 1e6);
            module.outbox.sampled_at_us = now;
        }
    }
    metrics
}

/// A run that could not produce a report: the error on stderr and, with
/// `--json`, one JSON object on stdout.
pub fn print_error(error: &str, json: bool) {
    eprintln!("minishop: {error}");
    if json {
        println!("{}", serde_json::json!({ "ok": false, "error": error }));
    }
}

/// With `--metrics-addr`, serves the Prometheus endpoint, before any
/// module starts (modules register their metrics when they start); on
/// failure the message and the exit code.
pub fn serve_metrics(args: &Args) -> Result<(), (String, u8)> {
    let Some(addr) = args.metrics_addr else {
        return Ok(());
    };
    #[cfg(feature = "prometheus")]
    {
        let exporter = tickbox::install_prometheus(addr)
            .map_err(|e| (format!("cannot serve the metrics: {e}"), 1))?;
        tracing::info!(
            "serving Prometheus metrics at http://{}/metrics",
            exporter.addr()
        );
        Ok(())
    }
    #[cfg(not(feature = "prometheus"))]
    Err((
        format!(
            "--metrics-addr {addr} needs the `prometheus` feature: \
             cargo run --release --features prometheus --example minishop -- --metrics-addr {addr}"
        ),
        2,
    ))
}
