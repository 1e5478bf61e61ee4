//! The final check: what the three databases hold, and what is wrong with
//! it.
//!
//! The catalog's log of price changes holds the id of every message it
//! published; whatever else reached a handler (`--disturb`'s messages) is
//! told apart by its id and counted on its own.

use crate::disturb::Sent;
use crate::faults::retrying;
use crate::plan::Plan;
use crate::tables::{
    self, Journey, LoggedChange, Product, ProductCopy, RepeatedEvent, StaleChange,
};
use crate::Modules;
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use tickbox::Backend;

/// Everything the check reads.
#[derive(Debug)]
pub struct Found {
    /// The catalog's products.
    products: Vec<Product>,
    /// The catalog's log of price changes.
    log: Vec<LoggedChange>,
    /// The catalog's plans.
    plans: Vec<Plan>,
    /// The storefront's copies.
    copies: Vec<ProductCopy>,
    /// The changes the storefront ignored.
    stale: Vec<StaleChange>,
    /// The journeys' audit rows.
    journeys: Vec<Journey>,
    /// The repeated events the journeys ignored.
    repeats: Vec<RepeatedEvent>,
    /// Outbox messages not yet delivered, over the three modules.
    pending: i64,
    /// Dead letters, over the three modules.
    dead_letters: i64,
}

/// The figures of the check, as the report shows them.
#[derive(Debug, Serialize)]
pub struct Figures {
    /// Whether every planned change was published with its product as
    /// ordering key.
    pub keyed: bool,
    /// Products in the catalog.
    pub products: usize,
    /// Changes planned by every run so far.
    pub planned: i64,
    /// Changes published: the rows of the catalog's log.
    pub changes: usize,
    /// Changes the storefront applied to its copies.
    pub applied: i64,
    /// Published changes the storefront ignored because its copy was as
    /// new or newer.
    pub stale_ignored: usize,
    /// Products whose storefront copy differs from the catalog's.
    pub mismatches: usize,
    /// The journeys' audit rows.
    pub journeys: usize,
    /// Event ids recorded more than once among them.
    pub duplicate_journeys: usize,
    /// Changes without a journey of the same product, version and price,
    /// and journeys of no change.
    pub journey_mismatches: usize,
    /// When every change was keyed: journeys whose sequence (the change's
    /// number in its product's order) is not the product's version, which
    /// counts the same changes.
    pub sequence_mismatches: usize,
    /// Published changes that reached the journeys twice past the inbox.
    pub repeats_ignored: usize,
    /// Older changes not from the catalog (`--disturb`, in this run or an
    /// earlier one) that the storefront ignored.
    pub injected_stale_ignored: usize,
    /// Repeated events not from the catalog that the journeys ignored.
    pub injected_repeats_ignored: usize,
    /// Outbox messages not yet delivered, over the three modules.
    pub pending: i64,
    /// Deliveries given up on, over the three modules.
    pub dead_letters: i64,
}

/// What became of this run's disturbing messages.
#[derive(Debug, Serialize)]
pub struct Disturbance {
    /// Older changes sent to the storefront.
    pub stale_sent: usize,
    /// Of them, those it ignored and counted.
    pub stale_ignored: usize,
    /// Recorded changes sent again to the journeys.
    pub repeats_sent: usize,
    /// Of them, those they ignored and counted.
    pub repeats_ignored: usize,
}

impl Found {
    /// Reads the three databases, each in a read-only transaction.
    pub async fn read<B: Backend>(modules: &Modules<B>) -> tickbox::Result<Found> {
        let (products, log, plans) = retrying("reading the catalog", || {
            modules.catalog.read(async |tx| {
                let products = tables::load_products(tx.conn()).await?;
                let log = tables::load_price_changes(tx.conn()).await?;
                let plans = tables::load_plans(tx.conn()).await?;
                Ok::<_, tickbox::Error>((products, log, plans))
            })
        })
        .await?;
        let (copies, stale) = retrying("reading the storefront", || {
            modules.storefront.read(async |tx| {
                let copies = tables::load_copies(tx.conn()).await?;
                let stale = tables::load_stale(tx.conn()).await?;
                Ok::<_, tickbox::Error>((copies, stale))
            })
        })
        .await?;
        let (journeys, repeats) = retrying("reading the journeys", || {
            modules.journeys.read(async |tx| {
                let journeys = tables::load_journeys(tx.conn()).await?;
                let repeats = tables::load_repeats(tx.conn()).await?;
                Ok::<_, tickbox::Error>((journeys, repeats))
            })
        })
        .await?;
        let (mut pending, mut dead_letters) = (0, 0);
        for module in [&modules.catalog, &modules.storefront, &modules.journeys] {
            let stats = module.store_stats().await?;
            pending += stats.outbox_pending;
            dead_letters += stats.dead_letters;
        }
        Ok(Found {
            products,
            log,
            plans,
            copies,
            stale,
            journeys,
            repeats,
            pending,
            dead_letters,
        })
    }

    /// The ids of the messages the catalog published.
    fn published_ids(&self) -> HashSet<&str> {
        self.log.iter().map(|c| c.message_id.as_str()).collect()
    }

    /// The figures.
    pub fn figures(&self) -> Figures {
        let published = self.published_ids();
        let from_catalog = |id: &String| published.contains(id.as_str());
        let stale_ignored = self
            .stale
            .iter()
            .filter(|s| from_catalog(&s.message_id))
            .count();
        let repeats_ignored = self
            .repeats
            .iter()
            .filter(|r| from_catalog(&r.message_id))
            .count();
        let event_ids: HashSet<&str> = self.journeys.iter().map(|j| j.event_id.as_str()).collect();
        let keyed = self.plans.iter().all(|p| p.keyed);
        let sequence_mismatches = if keyed {
            let numbered = |j: &&Journey| j.sequence == Some(j.version);
            self.journeys.iter().filter(|j| !numbered(j)).count()
        } else {
            0
        };
        Figures {
            keyed,
            products: self.products.len(),
            planned: self.plans.iter().map(|p| p.changes).sum(),
            changes: self.log.len(),
            applied: self.copies.iter().map(|c| c.applied).sum(),
            stale_ignored,
            mismatches: self.copy_mismatches().len(),
            journeys: self.journeys.len(),
            duplicate_journeys: self.journeys.len() - event_ids.len(),
            journey_mismatches: self.journey_mismatches(),
            sequence_mismatches,
            repeats_ignored,
            injected_stale_ignored: self.stale.len() - stale_ignored,
            injected_repeats_ignored: self.repeats.len() - repeats_ignored,
            pending: self.pending,
            dead_letters: self.dead_letters,
        }
    }

    /// The products whose copy differs from the catalog's (a product no
    /// change touched has no copy), and the copies of no product:
    /// "p00007: catalog v5 at 12.34, copy v4 at 56.78".
    fn copy_mismatches(&self) -> Vec<String> {
        let mut copies: HashMap<&str, &ProductCopy> = self
            .copies
            .iter()
            .map(|c| (c.product_id.as_str(), c))
            .collect();
        let mut found = Vec::new();
        for product in &self.products {
            let copy = copies.remove(product.id.as_str());
            let copied = copy.map(|c| (c.version, c.price));
            let expected = (product.version > 0).then_some((product.version, product.price));
            if copied != expected {
                found.push(format!(
                    "{}: catalog {}, copy {}",
                    product.id,
                    describe(expected),
                    describe(copied)
                ));
            }
        }
        found.extend(
            copies
                .keys()
                .map(|id| format!("{id}: a copy of no product")),
        );
        found.sort();
        found
    }

    /// Changes without a journey of the same product, version and price,
    /// and journeys of no change.
    fn journey_mismatches(&self) -> usize {
        let recorded: HashSet<(&str, i64, i64)> = self
            .journeys
            .iter()
            .map(|j| (j.product_id.as_str(), j.version, j.price))
            .collect();
        let changed: HashSet<(&str, i64, i64)> = self
            .log
            .iter()
            .map(|c| (c.product_id.as_str(), c.version, c.price))
            .collect();
        recorded.symmetric_difference(&changed).count()
    }

    /// What became of the disturbing messages `sent`: each ignored one left
    /// its id in the table of its safeguard.
    pub fn disturbance(&self, sent: &Sent) -> Disturbance {
        let stale: HashSet<&str> = self.stale.iter().map(|s| s.message_id.as_str()).collect();
        let repeats: HashSet<&str> = self.repeats.iter().map(|r| r.message_id.as_str()).collect();
        let found = |ids: &[uuid::Uuid], table: &HashSet<&str>| {
            ids.iter()
                .filter(|id| table.contains(id.to_string().as_str()))
                .count()
        };
        Disturbance {
            stale_sent: sent.stale.len(),
            stale_ignored: found(&sent.stale, &stale),
            repeats_sent: sent.repeats.len(),
            repeats_ignored: found(&sent.repeats, &repeats),
        }
    }

    /// What is wrong, in words; empty when all is well.
    pub fn problems(&self, figures: &Figures, disturbance: Option<&Disturbance>) -> Vec<String> {
        let mut problems = Vec::new();
        let mut problem = |wrong: bool, text: String| {
            if wrong {
                problems.push(text);
            }
        };
        let counted: i64 = self.plans.iter().map(|p| p.published).sum();
        problem(
            counted != figures.changes as i64,
            format!(
                "the plans count {counted} published changes, the catalog's log holds {}",
                figures.changes
            ),
        );
        problem(
            (figures.changes as i64) < figures.planned,
            format!(
                "{} planned changes are not published yet (--resume publishes them)",
                figures.planned - figures.changes as i64
            ),
        );
        let handled = figures.applied + figures.stale_ignored as i64;
        problem(
            handled != figures.changes as i64,
            format!(
                "the storefront handled {handled} of the {} changes ({} applied, {} ignored as stale)",
                figures.changes, figures.applied, figures.stale_ignored
            ),
        );
        problem(
            figures.keyed && figures.stale_ignored > 0,
            format!(
                "{} keyed changes reached the storefront after a newer change of their product",
                figures.stale_ignored
            ),
        );
        let mismatches = self.copy_mismatches();
        problem(
            !mismatches.is_empty(),
            format!(
                "{} copies differ from the catalog: {}",
                mismatches.len(),
                mismatches
                    .iter()
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        );
        problem(
            figures.journeys != figures.changes,
            format!(
                "{} journeys for {} changes",
                figures.journeys, figures.changes
            ),
        );
        problem(
            figures.duplicate_journeys > 0,
            format!("{} event ids recorded twice", figures.duplicate_journeys),
        );
        problem(
            figures.journey_mismatches > 0,
            format!(
                "{} changes and journeys do not match",
                figures.journey_mismatches
            ),
        );
        problem(
            figures.sequence_mismatches > 0,
            format!(
                "{} journeys carry a sequence other than their version",
                figures.sequence_mismatches
            ),
        );
        problem(
            figures.repeats_ignored > 0,
            format!(
                "{} published changes reached the journeys twice, past the inbox",
                figures.repeats_ignored
            ),
        );
        problem(
            figures.pending > 0,
            format!("{} messages are still pending", figures.pending),
        );
        problem(
            figures.dead_letters > 0,
            format!("{} deliveries were dead-lettered", figures.dead_letters),
        );
        if let Some(d) = disturbance {
            problem(
                d.stale_ignored != d.stale_sent,
                format!(
                    "the storefront ignored {} of the {} older changes sent to it",
                    d.stale_ignored, d.stale_sent
                ),
            );
            problem(
                d.repeats_ignored != d.repeats_sent,
                format!(
                    "the journeys ignored {} of the {} repeated events sent to them",
                    d.repeats_ignored, d.repeats_sent
                ),
            );
        }
        problems
    }
}

/// "v5 at 12.34", or "none".
fn describe(state: Option<(i64, i64)>) -> String {
    match state {
        Some((version, price)) => format!("v{version} at {}.{:02}", price / 100, price % 100),
        None => "none".into(),
    }
}
