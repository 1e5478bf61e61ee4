//! `queues`: the tool reads a handler's queue on the RabbitMQ broker while
//! a bus consumes it. Needs the broker (`TICKBOX_AMQP_URL`, or the local
//! one); it fails rather than skips without it.

use crate::support::{run_cli, Accept, CliPing, Db};
use tickbox::{Amqp, Bus, Module, Sqlite};

/// The broker: `TICKBOX_AMQP_URL`, or the local one.
fn amqp_url() -> String {
    std::env::var("TICKBOX_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

#[actix::test]
async fn queues_shows_a_handlers_queue_and_its_consumer() {
    let db = Db::new();
    let namespace = format!("cli.{:08x}", fastrand::u32(..));
    let path = db.dir.path().join("shop.db");
    let shop = Module::<Sqlite>::builder("shop", path.to_str().expect("utf-8"))
        .publishes::<CliPing>()
        .handler("shop.accept", Accept)
        .start()
        .await
        .expect("the module starts");
    let bus = Bus::builder()
        .module(&shop)
        .amqp(Amqp::new(amqp_url()).namespace(&namespace))
        .start()
        .await
        .expect("the bus starts over the broker");

    let args = |handler: &str| {
        vec![
            "--json".to_string(),
            "queues".to_string(),
            "--amqp-url".to_string(),
            amqp_url(),
            "--amqp-namespace".to_string(),
            namespace.clone(),
            handler.to_string(),
        ]
    };
    // The bus's consumer connects a moment after the bus starts.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let shown = loop {
        let shown = run_cli(args("shop/shop.accept")).await.json();
        if shown[0]["consumers"] == 1 || std::time::Instant::now() >= deadline {
            break shown;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(
        shown[0]["queue"],
        format!("tickbox.{namespace}.shop.shop.accept"),
        "{shown}"
    );
    assert_eq!(shown[0]["consumers"], 1, "{shown}");
    assert_eq!(shown[0]["messages"], 0, "{shown}");

    // A queue nobody declared: a clear error, the password hidden.
    let run = run_cli(args("shop/no.such.handler")).await;
    run.fails(1, "no.such.handler");
    assert!(!run.stderr.contains(":guest@"), "{}", run.stderr);
    run_cli(args("no-slash")).await.fails(1, "MODULE/HANDLER");
    bus.stop().await;
    delete_from_broker(&Amqp::new(amqp_url()).namespace(&namespace))
        .await
        .expect("the test's queue and exchange are deleted");
}

/// Deletes what the test's bus declared: its handler's queue and exchange.
async fn delete_from_broker(amqp: &Amqp) -> Result<(), lapin::Error> {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let properties = lapin::ConnectionProperties::default();
    let connection = lapin::Connection::connect(&amqp_url(), properties).await?;
    let channel = connection.create_channel().await?;
    let queue = amqp.queue("shop", "shop.accept");
    channel
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await?;
    channel
        .exchange_delete(
            amqp.exchange().as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await?;
    connection.close(200, "test done".into()).await
}
