//! SQLite's ordering statements: the inbox guard's fixed-shape ones run on
//! the connection's blocking thread, like the guard's insert; the others
//! are the defaults.

use crate::store::ordering::{
    advance_key_statement, start_key_statement, KeyScope, OrderingStatements, OwnedScope,
};
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;

impl OrderingStatements for Sqlite {
    async fn advance_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> QueryResult<bool> {
        let owned = OwnedScope::from(scope);
        conn.spawn_blocking(move |c| {
            use diesel::RunQueryDsl;
            let scope = owned.scope();
            Ok(advance_key_statement!(scope, sequence).execute(c)? == 1)
        })
        .await
    }

    async fn start_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> QueryResult<bool> {
        let owned = OwnedScope::from(scope);
        conn.spawn_blocking(move |c| {
            use diesel::RunQueryDsl;
            let scope = owned.scope();
            Ok(start_key_statement!(scope, sequence).execute(c)? == 1)
        })
        .await
    }
}
