//! The final check: what the databases seen here hold (all three, or over
//! amqp those of this process's modules and those found with the check
//! flags), and what is wrong with it.

use crate::db::Db;
use crate::faults::retrying;
use crate::{tables, Shop};
use std::collections::{BTreeMap, HashMap, HashSet};
use tickbox::Backend;

/// What the check reads from the databases this process sees: each part
/// is `None` when its module's database is not seen here (over amqp, a
/// module run elsewhere and not found with `--check-data-dir` /
/// `--check-database-url`).
#[derive(Debug, Default)]
pub struct Snapshot {
    /// (id, status, confirmations)
    pub orders: Option<Vec<(String, String, i32)>>,
    /// (order id, sku, quantity)
    pub reservations: Option<Vec<(String, String, i32)>>,
    /// (sku, seeded, available)
    pub stock: Option<Vec<(String, i64, i64)>>,
    /// The order id of every e-mail sent.
    pub emails: Option<Vec<String>>,
}

impl Snapshot {
    /// Reads each database seen in a read-only transaction.
    pub async fn read<B: Backend>(shop: &Shop<B>) -> tickbox::Result<Snapshot> {
        let mut snapshot = Snapshot::default();
        if let Some(orders) = &shop.orders {
            let loaded = retrying("reading orders", || {
                orders.read(async |tx| {
                    Ok::<_, tickbox::Error>(tables::load_orders(&mut Db::of(tx.conn())).await?)
                })
            })
            .await?;
            snapshot.orders = Some(loaded);
        }
        if let Some(warehouse) = &shop.warehouse {
            let (reservations, stock) = retrying("reading reservations", || {
                warehouse.read(async |tx| {
                    let mut db = Db::of(tx.conn());
                    let reservations = tables::load_reservations(&mut db).await?;
                    let stock = tables::load_stock(&mut db).await?;
                    Ok::<_, tickbox::Error>((reservations, stock))
                })
            })
            .await?;
            snapshot.reservations = Some(reservations);
            snapshot.stock = Some(stock);
        }
        if let Some(notifications) = &shop.notifications {
            let emails = retrying("reading e-mails", || {
                notifications.read(async |tx| {
                    Ok::<_, tickbox::Error>(
                        tables::load_email_orders(&mut Db::of(tx.conn())).await?,
                    )
                })
            })
            .await?;
            snapshot.emails = Some(emails);
        }
        Ok(snapshot)
    }

    /// Confirmations counted over every order (one each when all is well).
    pub fn confirmations(&self) -> Option<i64> {
        let orders = self.orders.as_ref()?;
        Some(orders.iter().map(|(_, _, c)| i64::from(*c)).sum())
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
const UNFINISHED: [&str; 3] = [
    "orders without a reservation",
    "orders never confirmed",
    "orders without a confirmation e-mail",
];

/// Checks the snapshot: every order has exactly one reservation, was
/// confirmed exactly once and has exactly one e-mail; nothing exists without
/// its order; the stock taken matches the reservations. Only what the
/// databases seen here can tell: without the orders database, that no order
/// has two reservations or two e-mails and that the stock matches. One
/// entry per kind of problem, with a few examples.
pub fn verify(snapshot: &Snapshot) -> Vec<Problem> {
    let mut problems: BTreeMap<&'static str, Vec<&str>> = BTreeMap::new();
    let mut problem = |what, id| problems.entry(what).or_default().push(id);

    let mut reservations: HashMap<&str, usize> = HashMap::new();
    let mut reserved_per_sku: HashMap<&str, i64> = HashMap::new();
    for (order_id, sku, quantity) in snapshot.reservations.iter().flatten() {
        *reservations.entry(order_id).or_default() += 1;
        *reserved_per_sku.entry(sku).or_default() += i64::from(*quantity);
    }
    let mut emails: HashMap<&str, usize> = HashMap::new();
    for order_id in snapshot.emails.iter().flatten() {
        *emails.entry(order_id).or_default() += 1;
    }
    // Done twice: seen without the orders database too.
    for (order_id, _) in reservations.iter().filter(|(_, n)| **n > 1) {
        problem("orders with more than one reservation", order_id);
    }
    for (order_id, _) in emails.iter().filter(|(_, n)| **n > 1) {
        problem("orders with more than one e-mail", order_id);
    }
    if let Some(orders) = &snapshot.orders {
        let mut known = HashSet::new();
        for (id, status, confirmations) in orders {
            known.insert(id.as_str());
            if snapshot.reservations.is_some() && !reservations.contains_key(id.as_str()) {
                problem("orders without a reservation", id);
            }
            match (*confirmations, status.as_str()) {
                (1, "confirmed") => {}
                (0, _) => problem("orders never confirmed", id),
                (1, _) => problem("orders counted confirmed but not in status confirmed", id),
                _ => problem("orders confirmed more than once", id),
            }
            if snapshot.emails.is_some() && !emails.contains_key(id.as_str()) {
                problem("orders without a confirmation e-mail", id);
            }
        }
        for order_id in reservations.keys().filter(|id| !known.contains(*id)) {
            problem("reservations for unknown orders", order_id);
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
        .collect()
}
