//! The MariaDB/MySQL servers the process tests run the examples on: the
//! shared one's URL (`TICKBOX_MYSQL_URL`), and statements run on a server
//! from outside the examples, to read their databases and to drop them at
//! the end. A server is named by its URL without parameters: the tests
//! read in clear, whatever the examples were given.

use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};

/// The server `TICKBOX_MYSQL_URL` names, with no database; the tests fail
/// without it.
pub fn server_url() -> String {
    std::env::var("TICKBOX_MYSQL_URL").expect(
        "the MariaDB/MySQL process tests need TICKBOX_MYSQL_URL, e.g. mysql://root@127.0.0.1:3306",
    )
}

/// A new prefix for the databases of one test, `tickbox_<name>_<random>`:
/// the examples name each module's database `<prefix>_<module>`.
pub fn new_prefix(name: &str) -> String {
    format!("tickbox_{name}_{:08x}", fastrand::u32(..))
}

/// Runs `work` on a new connection to `server`, on a runtime of its own
/// (the process tests are plain threads).
fn on_server<T>(
    server: &str,
    work: impl AsyncFnOnce(&mut AsyncMysqlConnection) -> diesel::QueryResult<T>,
) -> diesel::QueryResult<T> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut conn = AsyncMysqlConnection::establish(server)
            .await
            .map_err(|e| diesel::result::Error::QueryBuilderError(e.to_string().into()))?;
        work(&mut conn).await
    })
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[derive(diesel::QueryableByName)]
struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    t: String,
}

/// Runs `SELECT count(*) AS n …` on `server` and returns n; 0 when it
/// fails (before the tables exist).
pub fn count(server: &str, sql: &str) -> i64 {
    on_server(server, async |conn| {
        Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
    })
    .unwrap_or(0)
}

/// Runs `SELECT … AS t` on `server` and returns each row's `t`; panics if
/// it fails.
pub fn texts(server: &str, sql: &str) -> Vec<String> {
    on_server(server, async |conn| {
        diesel::sql_query(sql).load::<Text>(conn).await
    })
    .unwrap_or_else(|e| panic!("`{sql}` failed: {e}"))
    .into_iter()
    .map(|row| row.t)
    .collect()
}

/// Drops every database on `server` named `<prefix>_…`: what a test's
/// examples made. A server out of reach keeps them.
pub fn drop_databases(server: &str, prefix: &str) {
    let _ = on_server(server, async |conn| {
        let like = format!("{prefix}\\_%");
        let names: Vec<Text> = diesel::sql_query(format!(
            "SELECT schema_name AS t FROM information_schema.schemata WHERE schema_name LIKE '{like}'"
        ))
        .load(conn)
        .await?;
        for name in names {
            conn.batch_execute(&format!("DROP DATABASE IF EXISTS `{}`", name.t))
                .await?;
        }
        Ok(())
    });
}

/// Kills every connection to a database on `server` named `<prefix>_…`
/// but this one; how many it killed.
pub fn kill_connections(server: &str, prefix: &str) -> u32 {
    on_server(server, async |conn| {
        let like = format!("{prefix}\\_%");
        let ids: Vec<Count> = diesel::sql_query(format!(
            "SELECT CAST(id AS SIGNED) AS n FROM information_schema.processlist \
             WHERE db LIKE '{like}' AND id <> CONNECTION_ID()"
        ))
        .load(conn)
        .await?;
        let mut killed = 0;
        for id in ids {
            // A connection that ended meanwhile is no longer there to kill.
            if conn.batch_execute(&format!("KILL {}", id.n)).await.is_ok() {
                killed += 1;
            }
        }
        Ok(killed)
    })
    .unwrap_or_else(|e| panic!("killing the connections of {prefix}_…: {e}"))
}
