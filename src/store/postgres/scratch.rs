//! A test's PostgreSQL databases: a schema per module on the shared
//! server, named after the test's prefix, dropped with every table in it.

use crate::store::postgres::Postgres;
use crate::store::scratch::{scratch_name, ScratchDatabases, ScratchModule};
use std::time::Duration;

/// How long dropping a test's schemas may take: the statement's own lock
/// timeout (5 s) and the connection's time.
const DROP_DEADLINE: Duration = Duration::from_secs(15);

impl ScratchDatabases for Postgres {
    fn scratch_module(place: &str, prefix: &str, name: &str) -> ScratchModule {
        ScratchModule {
            url: place.to_owned(),
            schema: Some(scratch_name(prefix, name)),
            // Small, so that tests can run side by side on one server.
            pool_size: Some(4),
        }
    }

    fn drop_scratch(place: &str, prefix: &str) -> Result<(), String> {
        let sql = format!(
            "SET lock_timeout = '5s'; SET client_min_messages = warning; \
             DO $$DECLARE s text; BEGIN \
             FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE '{prefix}\\_%' LOOP \
             EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END$$;"
        );
        let url = place.to_owned();
        // Its own thread and runtime: a drop cannot await, and may run
        // inside another runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let dropping = async {
                let client = super::connect_client(&url).await?;
                client.batch_execute(&sql).await.map_err(|e| e.to_string())
            };
            runtime.block_on(async {
                tokio::time::timeout(DROP_DEADLINE, dropping)
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {DROP_DEADLINE:?}")))
            })
        })
        .join()
        .map_err(|_| "the thread dropping them panicked".to_string())?
    }
}
