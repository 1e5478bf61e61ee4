//! The final check: what the databases seen here hold (all three, or over
//! amqp those of this process's modules and those found with the check
//! flags), and what is wrong with it.

use crate::db::ShopDb;
use crate::faults::retrying;
use crate::mail::SEND_CONFIRMATION_EFFECT;
use crate::tables::OrderStatus;
use crate::{OrderConfirmed, Shop, SEND_CONFIRMATION};
use std::collections::{BTreeMap, HashMap, HashSet};
use tickbox::{EffectPolicy, EffectState, ModuleHandle};

/// What the check reads from the databases this process sees: each part
/// is `None` when its module's database is not seen here (over amqp, a
/// module run elsewhere and not found with `--check-data-dir` /
/// `--check-database-url`).
#[derive(Debug, Default)]
pub struct Snapshot {
    /// (id, status, confirmations)
    pub orders: Option<Vec<(String, String, i32)>>,
    /// Orders cancelled by a timeout before their deadline, or without one.
    pub cancelled_early: Option<Vec<String>>,
    /// (order id, sku, quantity)
    pub reservations: Option<Vec<(String, String, i32)>>,
    /// (sku, seeded, available)
    pub stock: Option<Vec<(String, i64, i64)>>,
    /// The order id of every order the warehouse found short.
    pub shortages: Option<Vec<String>>,
    /// The order id of every e-mail sent.
    pub emails: Option<Vec<String>>,
    /// Messages the orders saga ignored, per reason.
    pub saga_ignored: Option<Vec<(String, i64)>>,
    /// Messages the warehouse ignored, per reason.
    pub warehouse_ignored: Option<Vec<(String, i64)>>,
    /// The e-mails in the notifications module's effects journal.
    pub mail: Option<MailJournal>,
}

/// What the notifications module's effects journal tells of the e-mails
/// sent over SMTP (`--smtp`), over every run.
#[derive(Debug, Default)]
pub struct MailJournal {
    /// E-mails the SMTP server accepted, as far as minishop knows: the
    /// succeeded `send_confirmation` effects.
    pub sent: usize,
    /// Effects nobody can vouch for (unknown), of any handler.
    pub unknown: usize,
    /// Of those, e-mails sent at least once with a key that became unknown
    /// (due again past the key's window): nothing excuses them.
    pub unknown_with_key: usize,
    /// The orders whose e-mail is unknown under at-most-once and whose
    /// delivery waits as a dead letter for a person to settle it: they need
    /// no e-mail row, and their dead letters are expected.
    pub awaiting_a_person: Vec<String>,
    /// Whether any e-mail went through the journal (a run with `--smtp`).
    pub over_smtp: bool,
}

impl MailJournal {
    /// Reads the journal and the dead letters of the notifications module.
    async fn read<B: ShopDb>(notifications: &ModuleHandle<B>) -> tickbox::Result<MailJournal> {
        let states = [EffectState::Succeeded, EffectState::Unknown];
        let effects = retrying("reading the effects journal", || {
            notifications.effects(&states, 0, u64::MAX)
        })
        .await?;
        let any = retrying("reading the effects journal", || {
            notifications.effects(&[], 0, 1)
        })
        .await?;
        let dead_letters = retrying("reading dead letters", || {
            notifications.dead_letters(0, u64::MAX)
        })
        .await?;
        let is_email = |handler: &str, effect: &str| {
            handler == SEND_CONFIRMATION && effect == SEND_CONFIRMATION_EFFECT
        };
        let mut journal = MailJournal {
            over_smtp: !any.is_empty(),
            ..MailJournal::default()
        };
        let mut unknown_at_most_once = HashSet::new();
        for effect in &effects {
            match effect.state {
                EffectState::Succeeded if is_email(&effect.handler, &effect.effect) => {
                    journal.sent += 1;
                }
                EffectState::Unknown => {
                    journal.unknown += 1;
                    if !is_email(&effect.handler, &effect.effect) {
                        continue;
                    }
                    if effect.policy == EffectPolicy::at_most_once().name() {
                        unknown_at_most_once.insert(effect.message_id);
                    } else {
                        journal.unknown_with_key += 1;
                    }
                }
                _ => {}
            }
        }
        for letter in dead_letters {
            if letter.handler != SEND_CONFIRMATION
                || !unknown_at_most_once.contains(&letter.message_id)
            {
                continue;
            }
            if let Ok(confirmed) = serde_json::from_str::<OrderConfirmed>(&letter.payload) {
                journal.awaiting_a_person.push(confirmed.order_id);
            }
        }
        Ok(journal)
    }
}

impl Snapshot {
    /// Reads each database seen in a read-only transaction.
    pub async fn read<B: ShopDb>(shop: &Shop<B>) -> tickbox::Result<Snapshot> {
        let mut snapshot = Snapshot::default();
        if let Some(orders) = &shop.orders {
            let (loaded, early, ignored) = retrying("reading orders", || {
                orders.read(async |tx| {
                    let orders = B::load_orders(tx.conn()).await?;
                    let early = B::load_cancelled_early(tx.conn()).await?;
                    let ignored = B::ignored_per_reason(tx.conn()).await?;
                    Ok::<_, tickbox::Error>((orders, early, ignored))
                })
            })
            .await?;
            snapshot.orders = Some(loaded);
            snapshot.cancelled_early = Some(early);
            snapshot.saga_ignored = Some(ignored);
        }
        if let Some(warehouse) = &shop.warehouse {
            let (reservations, stock, shortages, ignored) =
                retrying("reading reservations", || {
                    warehouse.read(async |tx| {
                        let reservations = B::load_reservations(tx.conn()).await?;
                        let stock = B::load_stock(tx.conn()).await?;
                        let shortages = B::load_shortages(tx.conn()).await?;
                        let ignored = B::ignored_per_reason(tx.conn()).await?;
                        Ok::<_, tickbox::Error>((reservations, stock, shortages, ignored))
                    })
                })
                .await?;
            snapshot.reservations = Some(reservations);
            snapshot.stock = Some(stock);
            snapshot.shortages = Some(shortages);
            snapshot.warehouse_ignored = Some(ignored);
        }
        if let Some(notifications) = &shop.notifications {
            let emails = retrying("reading e-mails", || {
                notifications.read(async |tx| {
                    Ok::<_, tickbox::Error>(B::load_email_orders(tx.conn()).await?)
                })
            })
            .await?;
            snapshot.emails = Some(emails);
            snapshot.mail = Some(MailJournal::read(notifications).await?);
        }
        Ok(snapshot)
    }

    /// Confirmations counted over every order (one each when all is well).
    pub fn confirmations(&self) -> Option<i64> {
        let orders = self.orders.as_ref()?;
        Some(orders.iter().map(|(_, _, c)| i64::from(*c)).sum())
    }

    /// Orders rejected for want of stock.
    pub fn rejected(&self) -> Option<usize> {
        self.with_status(OrderStatus::Rejected)
    }

    /// Orders cancelled by their timeout (`--confirm-within`).
    pub fn timed_out(&self) -> Option<usize> {
        self.with_status(OrderStatus::Cancelled)
    }

    fn with_status(&self, status: OrderStatus) -> Option<usize> {
        let orders = self.orders.as_ref()?;
        let status = status.as_str();
        Some(orders.iter().filter(|(_, s, _)| s == status).count())
    }
}

/// One kind of problem the check found.
#[derive(Debug)]
pub struct Problem {
    pub text: String,
    /// Work not done yet (which `--resume` finishes), rather than work done
    /// wrongly.
    pub unfinished: bool,
}

/// Work left to do, which `--resume` finishes.
const UNFINISHED: [&str; 4] = [
    "orders without a reservation",
    "orders never settled (confirmed, rejected or cancelled)",
    "orders without a confirmation e-mail",
    "cancelled orders the warehouse has not answered",
];

/// Checks the snapshot: every confirmed order has exactly one reservation,
/// was confirmed exactly once and has exactly one e-mail; every rejected
/// order was found short by the warehouse and has no reservation, no
/// confirmation and no e-mail; every order cancelled by its timeout
/// (`--confirm-within`) was cancelled no earlier than its deadline, has no
/// confirmation and no e-mail, and the warehouse answered it (reserved, its
/// stock staying taken, or found short: the answer came late and the saga
/// ignored it); nothing exists without its order; the stock
/// taken matches the reservations. Only what the databases seen here can
/// tell: without the orders database, that no order has two reservations
/// or two e-mails, none is both reserved and found short, and that the
/// stock matches. One entry per kind of problem, with a few examples.
///
/// The e-mails sent over SMTP (`--smtp`), from the notifications module's
/// effects journal: none may be unknown under at-least-once-with-key (it
/// would wait for a person); an order whose e-mail is unknown under
/// at-most-once, its delivery dead-lettered, needs no e-mail row (the
/// policy allows exactly that, and a person settles it); and, with the
/// orders database, the e-mails sent and unknown add up to the confirmed
/// orders.
pub fn verify(snapshot: &Snapshot) -> Vec<Problem> {
    let mut problems: BTreeMap<&'static str, Vec<&str>> = BTreeMap::new();
    let mut problem = |what, id| problems.entry(what).or_default().push(id);

    let mut reservations: HashMap<&str, usize> = HashMap::new();
    let mut reserved_per_sku: HashMap<&str, i64> = HashMap::new();
    for (order_id, sku, quantity) in snapshot.reservations.iter().flatten() {
        *reservations.entry(order_id).or_default() += 1;
        *reserved_per_sku.entry(sku).or_default() += i64::from(*quantity);
    }
    let shortages: HashSet<&str> = snapshot
        .shortages
        .iter()
        .flatten()
        .map(String::as_str)
        .collect();
    let mut emails: HashMap<&str, usize> = HashMap::new();
    for order_id in snapshot.emails.iter().flatten() {
        *emails.entry(order_id).or_default() += 1;
    }
    // Done twice: seen without the orders database too.
    for (order_id, _) in reservations.iter().filter(|(_, n)| **n > 1) {
        problem("orders with more than one reservation", order_id);
    }
    for order_id in reservations.keys().filter(|id| shortages.contains(*id)) {
        problem("orders both reserved and found short", order_id);
    }
    for (order_id, _) in emails.iter().filter(|(_, n)| **n > 1) {
        problem("orders with more than one e-mail", order_id);
    }
    let awaiting: HashSet<&str> = snapshot
        .mail
        .iter()
        .flat_map(|mail| &mail.awaiting_a_person)
        .map(String::as_str)
        .collect();
    // Found by counting, not per order: said at the end.
    let mut counted = Vec::new();
    if let Some(mail) = snapshot.mail.as_ref().filter(|m| m.unknown_with_key > 0) {
        counted.push(Problem {
            text: format!(
                "{} e-mails unknown although sent at least once with a key (due again past the \
                 key's window): a person settles them (tickbox effects list --state unknown)",
                mail.unknown_with_key
            ),
            unfinished: false,
        });
    }
    if let Some(orders) = &snapshot.orders {
        let (confirmed, rejected, cancelled) = (
            OrderStatus::Confirmed.as_str(),
            OrderStatus::Rejected.as_str(),
            OrderStatus::Cancelled.as_str(),
        );
        for id in snapshot.cancelled_early.iter().flatten() {
            problem("orders cancelled before their deadline", id);
        }
        let mut known = HashSet::new();
        for (id, status, confirmations) in orders {
            known.insert(id.as_str());
            let id = id.as_str();
            let (is_rejected, is_cancelled) = (status == rejected, status == cancelled);
            match (*confirmations, status.as_str()) {
                (1, s) if s == confirmed => {}
                (0, s) if s == rejected || s == cancelled => {}
                (0, _) => problem(
                    "orders never settled (confirmed, rejected or cancelled)",
                    id,
                ),
                (1, _) => problem("orders counted confirmed but not in status confirmed", id),
                _ => problem("orders confirmed more than once", id),
            }
            let reserved = reservations.contains_key(id);
            if snapshot.reservations.is_some() {
                if is_cancelled {
                    if !reserved && !shortages.contains(id) {
                        problem("cancelled orders the warehouse has not answered", id);
                    }
                } else if is_rejected && reserved {
                    problem("rejected orders with a reservation", id);
                } else if is_rejected && !shortages.contains(id) {
                    problem("rejected orders the warehouse never found short", id);
                } else if !is_rejected && !reserved {
                    problem("orders without a reservation", id);
                }
            }
            if snapshot.emails.is_some() {
                match (is_rejected || is_cancelled, emails.contains_key(id)) {
                    (true, true) if is_cancelled => {
                        problem("cancelled orders with a confirmation e-mail", id);
                    }
                    (true, true) => problem("rejected orders with a confirmation e-mail", id),
                    // Unknown under at-most-once: no e-mail row, a person
                    // settles it.
                    (false, false) if awaiting.contains(id) => {}
                    (false, false) => problem("orders without a confirmation e-mail", id),
                    _ => {}
                }
            }
        }
        if let Some(mail) = snapshot.mail.as_ref().filter(|m| m.over_smtp) {
            let confirmed = orders.iter().filter(|(_, s, _)| s == confirmed).count();
            let (sent, unknown) = (mail.sent, mail.unknown);
            if sent + unknown != confirmed {
                counted.push(Problem {
                    text: format!(
                        "the journal's e-mails, {sent} sent and {unknown} unknown, do not add up \
                         to the {confirmed} confirmed orders"
                    ),
                    // Fewer: e-mails not sent yet, which `--resume` sends.
                    unfinished: sent + unknown < confirmed,
                });
            }
        }
        for order_id in reservations.keys().filter(|id| !known.contains(*id)) {
            problem("reservations for unknown orders", order_id);
        }
        for order_id in shortages.iter().filter(|id| !known.contains(*id)) {
            problem("shortages for unknown orders", order_id);
        }
        for order_id in emails.keys().filter(|id| !known.contains(*id)) {
            problem("e-mails for unknown orders", order_id);
        }
    }
    for (sku, seeded, available) in snapshot.stock.iter().flatten() {
        let reserved = reserved_per_sku.get(sku.as_str()).copied().unwrap_or(0);
        if seeded - available != reserved {
            problem(
                "items whose stock taken differs from their reservations",
                sku,
            );
        }
    }
    problems
        .into_iter()
        .map(|(what, ids)| {
            let examples = ids[..ids.len().min(3)].join(", ");
            let more = if ids.len() > 3 { ", …" } else { "" };
            Problem {
                text: format!("{} {what} (e.g. {examples}{more})", ids.len()),
                unfinished: UNFINISHED.contains(&what),
            }
        })
        .chain(counted)
        .collect()
}
