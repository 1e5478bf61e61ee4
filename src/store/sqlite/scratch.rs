//! A test's SQLite databases: one file per module in the test's temporary
//! directory, which removes itself.

use crate::store::scratch::{ScratchDatabases, ScratchModule};
use crate::store::sqlite::Sqlite;

impl ScratchDatabases for Sqlite {
    fn scratch_module(place: &str, _prefix: &str, name: &str) -> ScratchModule {
        let path = std::path::Path::new(place).join(format!("{name}.db"));
        ScratchModule {
            url: path.to_string_lossy().into_owned(),
            schema: None,
            pool_size: None,
        }
    }

    fn drop_scratch(_place: &str, _prefix: &str) -> Result<(), String> {
        // The temporary directory goes with its files.
        Ok(())
    }
}
