//! A test's MariaDB or MySQL databases: one database per module on the
//! shared server, named after the test's prefix, dropped at the end.

use super::Mysql;
use crate::store::scratch::{scratch_name, ScratchDatabases, ScratchModule};
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use std::time::Duration;

/// How long dropping a test's databases may take: the statements' own lock
/// wait (5 s each) and the connection's time.
const DROP_DEADLINE: Duration = Duration::from_secs(30);

/// A database's name, as `information_schema.schemata` lists it.
#[derive(diesel::QueryableByName)]
struct Database {
    /// The name.
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

impl ScratchDatabases for Mysql {
    fn scratch_module(place: &str, prefix: &str, name: &str) -> ScratchModule {
        ScratchModule {
            url: place.to_owned(),
            schema: Some(scratch_name(prefix, name)),
            // Small, so that tests can run side by side on one server.
            pool_size: Some(4),
        }
    }

    fn drop_scratch(place: &str, prefix: &str) -> Result<(), String> {
        let url = place.to_owned();
        let pattern = format!("{prefix}\\_%");
        // Its own thread and runtime: a drop cannot await, and may run
        // inside another runtime.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let dropping = async {
                let mut conn = super::establish(&url).await.map_err(|e| e.to_string())?;
                conn.batch_execute("SET SESSION lock_wait_timeout = 5")
                    .await
                    .map_err(|e| e.to_string())?;
                let databases: Vec<Database> = diesel::sql_query(
                    "SELECT CAST(schema_name AS CHAR) AS name FROM information_schema.schemata \
                     WHERE schema_name LIKE ?",
                )
                .bind::<diesel::sql_types::Text, _>(&pattern)
                .load(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                for database in databases {
                    let name = database.name.replace('`', "``");
                    conn.batch_execute(&format!("DROP DATABASE IF EXISTS `{name}`"))
                        .await
                        .map_err(|e| format!("dropping {}: {e}", database.name))?;
                }
                Ok(())
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
