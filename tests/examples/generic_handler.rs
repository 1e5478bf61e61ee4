//! The generic handler example: its one handler type archives every note on
//! SQLite and (feature `postgres`, `TICKBOX_PG_URL`) on PostgreSQL.

use super::run;
#[cfg(feature = "postgres")]
use super::run_with;

#[test]
fn the_generic_handler_example_archives_every_note_on_sqlite() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("generic_handler", dir.path());
    assert!(output.contains("sqlite: archived 3 of 3 notes"), "{output}");
}

#[cfg(feature = "postgres")]
#[test]
fn the_generic_handler_example_archives_every_note_on_postgres() {
    let database = FreshDatabase::new();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run_with(
        "generic_handler",
        dir.path(),
        &["--database-url", database.url.as_str()],
    );
    assert!(
        output.contains("postgres: archived 3 of 3 notes"),
        "{output}"
    );
}

/// A database of its own beside the one `TICKBOX_PG_URL` names, so that the
/// example's fixed schemas meet no other run's; dropped at the end.
#[cfg(feature = "postgres")]
struct FreshDatabase {
    /// Where the test connects to create and drop it.
    admin: String,
    name: String,
    url: url::Url,
}

#[cfg(feature = "postgres")]
impl FreshDatabase {
    fn new() -> Self {
        let admin = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL example test needs TICKBOX_PG_URL, e.g. \
             postgres://postgres@127.0.0.1:5432/test",
        );
        let name = format!("generic_handler_{:08x}", fastrand::u32(..));
        crate::processes::psql(&admin, &format!("CREATE DATABASE {name}"));
        let mut url = url::Url::parse(&admin).expect("TICKBOX_PG_URL is a URL");
        url.set_path(&name);
        FreshDatabase { admin, name, url }
    }
}

/// Dropped as the process tests drop theirs: without panicking, since a
/// failed test is unwinding through here.
#[cfg(feature = "postgres")]
impl Drop for FreshDatabase {
    fn drop(&mut self) {
        let drop = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let _ = std::process::Command::new("psql")
            .args([self.admin.as_str(), "-qc", &drop])
            .output();
    }
}
