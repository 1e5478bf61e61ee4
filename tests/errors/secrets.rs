//! No secret shown, whatever the shape of the URL it is in.

use super::{assert_hidden, HOSTILE};
use crate::support::trace_init;
#[cfg(feature = "amqp")]
use crate::support::{TestBackend, TestDb};
use std::process::Command;
use tickbox::{Module, Sqlite};

/// What a person sees of an error: its message and its `Debug` form.
fn shown(error: &tickbox::Error) -> String {
    format!("{error}\n{error:?}")
}

#[actix::test]
async fn an_sqlite_module_shows_no_secret_of_any_shape() {
    trace_init();
    for url in HOSTILE {
        // Attaching opens no file that is not there: a shape without a
        // directory would otherwise become a new file in the working
        // directory.
        let attached = Module::<Sqlite>::builder("orders", url).attach().await;
        let error = attached.expect_err(url);
        assert_hidden(url, &shown(&error));
        if url.contains('/') {
            // Each names a directory that does not exist, or is no path.
            let started = Module::<Sqlite>::builder("orders", url).start().await;
            let error = started.expect_err(url);
            assert_hidden(url, &shown(&error));
        }
    }
}

#[cfg(feature = "postgres")]
#[actix::test]
async fn a_postgres_module_shows_no_secret_of_any_shape() {
    trace_init();
    let hostile = HOSTILE.iter().copied();
    // A URL the server is not even reached with: its port is closed.
    for url in hostile.chain(["postgres://u:S3cret@127.0.0.1:1/db"]) {
        let started = Module::<tickbox::Postgres>::builder("orders", url)
            .start()
            .await;
        let error = started.expect_err(url);
        assert_hidden(url, &shown(&error));
    }
}

#[cfg(feature = "amqp")]
#[actix::test]
async fn the_broker_settings_show_no_secret_of_any_shape() {
    trace_init();
    let db = TestDb::new();
    let orders = Sqlite::module(&db, "orders")
        .start()
        .await
        .expect("orders starts");
    for url in HOSTILE {
        let amqp = tickbox::Amqp::new(url);
        assert_hidden(url, &format!("{amqp:?} {}", amqp.redacted_url()));
        let started = tickbox::Bus::builder()
            .module(&orders)
            .amqp(amqp)
            .start()
            .await;
        let error = started.err().expect(url);
        assert!(matches!(error, tickbox::Error::Config(_)), "{url}: {error}");
        assert_hidden(url, &shown(&error));
    }
}

/// Runs an example's binary with `args`; its exit code and stderr.
fn run(binary: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(binary)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{} runs: {e}", binary.display()));
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn the_examples_command_lines_show_no_secret_of_any_shape() {
    let minishop = crate::processes::minishop();
    let catalog = minishop.with_file_name("catalog");
    for url in HOSTILE {
        for (binary, args) in [
            (&minishop, vec!["--database-url", url]),
            (
                &minishop,
                vec![
                    "--database-url",
                    "postgres://u@127.0.0.1:1/db",
                    "--transport",
                    "amqp",
                    "--check-database-url",
                    url,
                ],
            ),
            (&minishop, vec!["--amqp-url", url]),
            (&catalog, vec!["--database-url", url]),
        ] {
            let (code, stderr) = run(binary, &args);
            assert_hidden(&format!("{args:?}"), &stderr);
            if url.starts_with("mysql://") && args[0] != "--amqp-url" {
                // A MariaDB/MySQL URL the examples take: refused by the
                // command line only beside a PostgreSQL one, and otherwise
                // when the server `h` cannot be reached.
                assert!(matches!(code, Some(1 | 2)), "{args:?}: {stderr}");
                continue;
            }
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            assert!(stderr.contains("invalid value"), "{args:?}: {stderr}");
        }
        // A URL given without its flag is quoted as an unexpected
        // argument; a lone word is shown as typed (it is likely a typo).
        if url != "S3cret" {
            for binary in [&minishop, &catalog] {
                let (code, stderr) = run(binary, &[url]);
                assert_eq!(code, Some(2), "{url}: {stderr}");
                assert!(stderr.contains("unexpected argument"), "{url}: {stderr}");
                assert_hidden(url, &stderr);
            }
        }
    }
}
