//! A database that cannot be opened says why.

use crate::support::trace_init;
use tickbox::{Error, Module, Sqlite};

#[actix::test]
async fn an_sqlite_file_in_a_missing_directory_names_the_directory() {
    trace_init();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let missing = dir.path().join("no-such-directory");
    let path = missing.join("orders.db");
    let path = path.to_str().expect("a UTF-8 path");
    for opened in [
        Module::<Sqlite>::builder("orders", path).start().await,
        Module::<Sqlite>::builder("orders", path).attach().await,
    ] {
        let error = opened.expect_err("no directory");
        let Error::MissingDirectory {
            module,
            path: shown,
            directory,
        } = &error
        else {
            panic!("a missing directory, not: {error:?}");
        };
        assert_eq!(module, "orders");
        assert_eq!(shown, path);
        assert_eq!(directory, missing.to_str().expect("a UTF-8 path"));
        assert!(!error.is_transient(), "{error}");
        let text = error.to_string();
        assert!(
            text.contains(&format!("the directory {directory} does not exist")),
            "{text}"
        );
    }
    assert!(!missing.exists(), "no directory was made");
}

#[cfg(feature = "postgres")]
#[actix::test]
async fn a_postgres_server_refusing_the_connection_is_unreachable_and_transient() {
    trace_init();
    // Nothing listens on port 1.
    let url = "postgres://tickbox:S3cret@127.0.0.1:1/nowhere";
    let error = Module::<tickbox::Postgres>::builder("orders", url)
        .start()
        .await
        .expect_err("refused");
    let Error::DatabaseUnreachable {
        module,
        address,
        reason,
    } = &error
    else {
        panic!("an unreachable server, not: {error:?}");
    };
    assert_eq!(module, "orders");
    assert_eq!(address, "127.0.0.1:1");
    assert!(reason.contains("refused the connection"), "{reason}");
    assert!(reason.contains("os error"), "the OS's reason: {reason}");
    assert!(error.is_transient(), "a server may be starting: {error}");
    super::assert_hidden(url, &format!("{error} {error:?}"));
}

#[cfg(feature = "postgres")]
#[actix::test]
async fn a_postgres_server_without_the_database_is_a_bad_url_not_a_transient_failure() {
    trace_init();
    let base = std::env::var("TICKBOX_PG_URL").expect("TICKBOX_PG_URL");
    let (server, _) = base.rsplit_once('/').expect("a URL ending in /database");
    let url = format!("{server}/tickbox_no_such_database");
    let error = Module::<tickbox::Postgres>::builder("orders", url)
        .start()
        .await
        .expect_err("no such database");
    assert!(
        matches!(&error, Error::BadDatabaseUrl { reason, .. } if reason.contains("does not exist")),
        "{error:?}"
    );
    assert!(!error.is_transient(), "{error}");
}
