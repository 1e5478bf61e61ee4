//! SQLite's ordering statements: the inbox guard's fixed-shape ones run on
//! the connection's blocking thread, like the guard's insert; the others
//! are the defaults.

use crate::store::ordering::{
    advance_key_statement, start_key_statement, KeyScope, OrderingStatements,
};
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;

/// A [`KeyScope`] that owns its texts, to move to the connection's
/// blocking thread.
pub(crate) struct OwnedScope {
    handler: String,
    publisher: String,
    topic: String,
    key: String,
}

impl From<KeyScope<'_>> for OwnedScope {
    fn from(scope: KeyScope<'_>) -> Self {
        OwnedScope {
            handler: scope.handler.to_owned(),
            publisher: scope.publisher.to_owned(),
            topic: scope.topic.to_owned(),
            key: scope.key.to_owned(),
        }
    }
}

impl OwnedScope {
    /// Borrowed again.
    pub(crate) fn scope(&self) -> KeyScope<'_> {
        KeyScope {
            handler: &self.handler,
            publisher: &self.publisher,
            topic: &self.topic,
            key: &self.key,
        }
    }
}

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
