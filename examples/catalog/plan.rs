//! A run's plan of price changes: which product gets which price, drawn
//! from a seed, so that a resumed run makes exactly the changes a killed
//! one had not made yet. Plans are recorded in the catalog's database
//! (`change_plans`), each with how many of its changes are made.

use crate::cli::NewPlan;
use crate::tables;
use tickbox::{Backend, ModuleHandle};

/// A plan as the catalog's `change_plans` table keeps it.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Its number: plans are published one after the other.
    pub id: i64,
    /// Seed of the random choices.
    pub seed: i64,
    /// Products the changes are spread over (`p00000` onwards).
    pub products: i64,
    /// Changes planned.
    pub changes: i64,
    /// Changes published so far; the next is number `published + 1`.
    pub published: i64,
    /// Whether its changes are published with the product as ordering key.
    pub keyed: bool,
}

/// One planned change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// The product whose price changes.
    pub product_id: String,
    /// Its new price, in cents.
    pub price: i64,
}

impl Plan {
    /// Change number `number` (1 for the first): the same whenever it is
    /// asked for.
    pub fn change(&self, number: i64) -> Change {
        let mixed = (self.seed as u64) ^ (number as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut rng = fastrand::Rng::with_seed(mixed);
        Change {
            product_id: product_id(rng.u64(0..self.products as u64)),
            price: rng.i64(100..=100_000),
        }
    }
}

/// The id of the product numbered `index` (from 0).
pub fn product_id(index: u64) -> String {
    format!("p{index:05}")
}

/// Records `new`, this run's plan (none with `--resume`); then every plan
/// with changes still to make, this one and any a killed run left, oldest
/// first.
pub async fn unfinished<B: Backend>(
    catalog: &ModuleHandle<B>,
    new: Option<NewPlan>,
) -> tickbox::Result<Vec<Plan>> {
    match new {
        Some(new) => {
            let plan = catalog
                .transaction(async move |tx| {
                    Ok::<_, tickbox::Error>(tables::create_plan(tx.conn(), new).await?)
                })
                .await?;
            tracing::info!(
                plan = plan.id,
                changes = plan.changes,
                products = plan.products,
                keyed = plan.keyed,
                seed = plan.seed as u64,
                "planned"
            );
        }
        None => tracing::info!("resuming: no new plan; finishing what is planned and pending"),
    }
    let plans = catalog
        .read(async |tx| Ok::<_, tickbox::Error>(tables::load_plans(tx.conn()).await?))
        .await?;
    Ok(plans
        .into_iter()
        .filter(|p| p.published < p.changes)
        .collect())
}
