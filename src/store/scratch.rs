//! Throw-away databases for tests, as each backend makes and removes them:
//! what the test kit's [`TestDatabases`](crate::testing::TestDatabases)
//! asks of a backend.

/// Where one test module's tables go.
#[derive(Debug, Clone)]
// Read by the test kit only (feature `testing`).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub struct ScratchModule {
    /// The database URL (SQLite: the file's path).
    pub(crate) url: String,
    /// The namespace within that database the module gets to itself
    /// (PostgreSQL: its schema), if the backend has one.
    pub(crate) schema: Option<String>,
    /// A small pool where the server is shared by tests running side by
    /// side; `None`: the backend's default.
    pub(crate) pool_size: Option<usize>,
}

/// Making and removing a test's databases: implemented by each backend in
/// its folder's `scratch.rs`.
pub trait ScratchDatabases {
    /// Where module `name` of the test whose names all begin with `prefix`
    /// keeps its tables; `place` is the test's place: a temporary directory
    /// for SQLite, the server's URL otherwise.
    fn scratch_module(place: &str, prefix: &str, name: &str) -> ScratchModule;

    /// Removes every database or schema of the test whose names begin with
    /// `prefix`, from the server at `place`, within a deadline (a server out
    /// of reach must not hold a test); a reason when it could not.
    fn drop_scratch(place: &str, prefix: &str) -> Result<(), String>;
}

/// The name of module `name`'s own namespace in a test whose names begin
/// with `prefix`: lower case, as the servers fold unquoted names.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) fn scratch_name(prefix: &str, name: &str) -> String {
    format!("{prefix}_{name}").to_lowercase()
}
