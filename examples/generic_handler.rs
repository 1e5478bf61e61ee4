//! One handler for every backend: `KeepNote` is written once, as
//! `impl<B: Backend> Handler<B>`, and runs on SQLite and PostgreSQL alike.
//! Each of its diesel queries is a function whose type `#[dsl::auto_type]`
//! names after it; the handler's `where` clause says that the backend's
//! connection runs them (`ExecuteDsl` for an insert, `LoadQuery` for a
//! select). The bound names no backend: it is checked for the one a module
//! starts on.
//!
//! `desk` publishes three notes under this run's id; `archive`'s handler
//! inserts each and selects the run's notes so far. The run then reads them
//! back and fails unless each of the three arrived once.
//!
//! Run it with `cargo run --example generic_handler` (SQLite, under
//! `data/`), or on PostgreSQL, a schema per module, with
//! `cargo run --features postgres --example generic_handler -- --database-url postgres://…`.

use clap::Parser;
use serde::{Deserialize, Serialize};
use std::error::Error;
use std::time::Duration;
use tickbox::diesel::{self, dsl, ExpressionMethods, QueryDsl};
use tickbox::diesel_async::methods::{ExecuteDsl, LoadQuery};
use tickbox::diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use tickbox::{Backend, Bus, Delivery, Handler, HandlerError, Message, Module, ModuleBuilder, Tx};

#[derive(Serialize, Deserialize)]
struct NoteTaken {
    run: String,
    body: String,
}
impl Message for NoteTaken {
    const TOPIC: &'static str = "desk.note_taken";
}

// The archive's table; its SQL, like every query here, is every backend's.
diesel::table! {
    notes (message_id) {
        message_id -> Text,
        run -> Text,
        body -> Text,
    }
}
const NOTES: &str = "CREATE TABLE IF NOT EXISTS notes \
    (message_id TEXT PRIMARY KEY, run TEXT NOT NULL, body TEXT NOT NULL)";

// Each query is a function; `auto_type` names its type after it, for the
// bounds below.
#[dsl::auto_type]
fn insert_note(message_id: String, run: String, body: String) -> _ {
    let values = (
        notes::message_id.eq(message_id),
        notes::run.eq(run),
        notes::body.eq(body),
    );
    dsl::insert_into(notes::table).values(values)
}

#[dsl::auto_type]
fn notes_of_run(run: String) -> _ {
    notes::table.filter(notes::run.eq(run)).select(notes::body)
}

/// Archives a note, in the delivery's transaction, on every backend whose
/// connection runs its two queries.
struct KeepNote;
impl<B: Backend> Handler<B> for KeepNote
where
    insert_note: ExecuteDsl<B::Connection>,
    notes_of_run: LoadQuery<'static, B::Connection, String>,
{
    type Message = NoteTaken;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        note: NoteTaken,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let message_id = delivery.envelope.id.to_string();
        let insert = insert_note(message_id, note.run.clone(), note.body);
        insert.execute(tx.conn()).await?;
        let kept = notes_of_run(note.run)
            .load::<String>(tx.conn())
            .await?
            .len();
        println!("{}: notes of this run archived so far: {kept}", B::NAME);
        Ok(())
    }
}

/// On SQLite by default; on PostgreSQL with `--database-url`.
#[derive(Parser)]
struct Args {
    /// PostgreSQL (feature `postgres`): schemas generic_desk, generic_archive
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
}

#[actix::main]
async fn main() -> Result<(), Box<dyn Error>> {
    match Args::parse().database_url {
        None => {
            std::fs::create_dir_all("data")?;
            run(|name| Module::<tickbox::Sqlite>::builder(name, format!("data/{name}.db"))).await
        }
        #[cfg(feature = "postgres")]
        Some(url) => {
            let schema = |name: &str| format!("generic_{name}");
            run(|name| Module::<tickbox::Postgres>::builder(name, &url).schema(schema(name))).await
        }
        #[cfg(not(feature = "postgres"))]
        Some(_) => Err("--database-url needs the `postgres` feature".into()),
    }
}

/// Code that stays generic asks the same of `B`: that `KeepNote` handles on
/// it, and that its connection runs the one query `run` makes itself.
async fn run<B: Backend>(module: impl Fn(&str) -> ModuleBuilder<B>) -> Result<(), Box<dyn Error>>
where
    KeepNote: Handler<B>,
    notes_of_run: LoadQuery<'static, B::Connection, String>,
{
    let desk = module("desk").publishes::<NoteTaken>().start().await?;
    let archive = module("archive").handler("archive.keep_note", KeepNote);
    let archive = archive.start().await?;
    archive
        .transaction(async |tx| Ok::<_, tickbox::Error>(tx.conn().batch_execute(NOTES).await?))
        .await?;
    let bus = Bus::builder().module(&desk).module(&archive);
    let bus = bus.start().await?;

    let run = uuid::Uuid::now_v7().to_string();
    let sent = ["buy milk", "call the plumber", "water the plants"];
    for body in sent {
        let (run, body) = (run.clone(), body.to_string());
        let note = async move |tx: &mut Tx<B>| tx.publish(&NoteTaken { run, body }).map(drop);
        desk.transaction(note).await?;
    }
    let delivered = bus.wait_idle(Duration::from_secs(10)).await?;
    bus.stop().await;

    let mut kept: Vec<String> = archive
        .read(async move |tx| Ok::<_, tickbox::Error>(notes_of_run(run).load(tx.conn()).await?))
        .await?;
    kept.sort();
    println!("{}: archived {} of 3 notes", B::NAME, kept.len());
    if !delivered || kept != sent {
        return Err(format!("sent {sent:?}, but the archive holds {kept:?}").into());
    }
    Ok(())
}
