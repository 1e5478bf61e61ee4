//! What the tool reads from a module's database with SQL of its own, where
//! the library offers no call: written once per backend.

use tickbox::{diesel, Backend, ModuleHandle};
use uuid::Uuid;

/// The tool's own queries on a module's database.
pub(crate) trait Inspect: Backend {
    /// The number of outbox messages still pending that were published
    /// before `before_us` (µs since the Unix epoch).
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64>;

    /// Whether a handler named `handler` has run in this module (each
    /// module records its handlers when it starts): the module whose
    /// effects journal holds that handler's effects.
    async fn runs_handler(module: &ModuleHandle<Self>, handler: &str) -> tickbox::Result<bool>;
}

/// A row of `SELECT count(*) AS n`.
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The smallest UUIDv7 of the millisecond holding `unix_us`: every UUIDv7
/// made before that millisecond compares lower. Pending messages are told
/// by their ids, as the bus's watchdog tells them (so the pending index
/// answers, and `status` counts what `tickbox_outbox_stalled` counts).
fn earliest_id_at(unix_us: i64) -> Uuid {
    let ms = (unix_us / 1000).max(0) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    Uuid::from_bytes(bytes)
}

/// Counts handlers named `handler` in `tickbox_handlers`, with `$param`
/// the dialect's placeholder.
macro_rules! runs_handler {
    ($module:expr, $handler:expr, $param:literal) => {{
        use tickbox::diesel_async::RunQueryDsl as _;
        let handler = $handler.to_string();
        $module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(concat!(
                    "SELECT count(*) AS n FROM tickbox_handlers WHERE handler = ",
                    $param
                ))
                .bind::<diesel::sql_types::Text, _>(handler)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n > 0)
            })
            .await
    }};
}

#[cfg(feature = "sqlite")]
impl Inspect for tickbox::Sqlite {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use tickbox::diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us).as_bytes().to_vec();
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < ?",
                )
                .bind::<diesel::sql_types::Binary, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }

    async fn runs_handler(module: &ModuleHandle<Self>, handler: &str) -> tickbox::Result<bool> {
        runs_handler!(module, handler, "?")
    }
}

#[cfg(feature = "postgres")]
impl Inspect for tickbox::Postgres {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use tickbox::diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us);
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < $1",
                )
                .bind::<diesel::sql_types::Uuid, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }

    async fn runs_handler(module: &ModuleHandle<Self>, handler: &str) -> tickbox::Result<bool> {
        runs_handler!(module, handler, "$1")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_earliest_id_of_a_millisecond_orders_below_its_uuidv7s() {
        let at_us = 1_767_225_600_123_456;
        let cutoff = earliest_id_at(at_us);
        let same_ms = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            123_999_000,
        ));
        let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            122_999_000,
        ));
        assert!(earlier < cutoff && cutoff <= same_ms);
        assert_eq!(
            earliest_id_at(-5),
            Uuid::from_bytes([0, 0, 0, 0, 0, 0, 0x70, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        );
    }
}
