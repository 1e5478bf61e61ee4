//! A module's name as its database records it: each module writes its name
//! there when it starts, so that a tool attaching to the database by its URL
//! names it as the application does.

use crate::error::Result;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;

impl<B: Backend> ModuleHandle<B> {
    /// The name of the module that last started on this database, as its
    /// database records it (every module records its name when it starts);
    /// `None` when no module has started on it since its tables were made.
    ///
    /// For tools that attach to a database by its URL
    /// ([`ModuleBuilder::attach`](crate::ModuleBuilder::attach)) and must
    /// say which of the application's modules it belongs to; in the
    /// application itself it is [`ModuleHandle::name`].
    pub async fn recorded_name(&self) -> Result<Option<String>> {
        self.core
            .db
            .call("reading the module's recorded name", async |conn| {
                Ok(B::last_started_module(conn).await?)
            })
            .await
    }
}
