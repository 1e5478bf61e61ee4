//! Every command, run as a separate process against a module database that
//! a test module created and filled, generic over the backend.

use crate::support::*;
use serde_json::Value;
use std::time::Duration;
use tickbox::Bus;
use uuid::Uuid;

async fn status_counts_what_the_tables_hold<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;

    let empty = status::<B>(&db).await;
    assert_eq!(empty["backend"], B::NAME);
    assert_eq!(empty["outbox_pending"], 0);
    assert_eq!(empty["oldest_pending_us"], Value::Null);
    assert_eq!(empty["lag_seconds"], Value::Null);
    assert_eq!(empty["inbox_rows"], 0);
    assert_eq!(empty["dead_letters"], 0);
    let text = on::<B>(&db, &["status"]).await;
    assert!(text.ok().contains("nothing pending"), "{text:#?}");

    // Two pending messages, the oldest 90 s old; one delivered.
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, uuid_ago(Duration::from_secs(90)), oldest_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;
    insert_outbox(
        &module,
        Uuid::now_v7(),
        micros_ago(Duration::ZERO),
        Some(micros_ago(Duration::ZERO)),
    )
    .await;
    for handler in ["orders.ping", "orders.audit", "orders.mail"] {
        insert_inbox(&module, Uuid::now_v7(), handler, micros_ago(Duration::ZERO)).await;
    }
    insert_dead(&module, &Dead::ping(Uuid::now_v7())).await;
    insert_dead(&module, &Dead::ping(Uuid::now_v7())).await;

    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 2, "{stats}");
    assert_eq!(stats["oldest_pending_us"], oldest_us, "{stats}");
    let lag = stats["lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    assert_eq!(stats["inbox_rows"], 3, "{stats}");
    assert_eq!(stats["dead_letters"], 2, "{stats}");

    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox pending   2 messages"), "{out}");
    assert!(out.contains("outbox lag       1m "), "{out}");
    assert!(out.contains("inbox rows       3"), "{out}");
    assert!(out.contains("dead letters     2"), "{out}");

    // The URL can come from the environment instead of the flag.
    let mut args = B::extra_args(&db);
    args.extend(["--json".to_string(), "status".to_string()]);
    let from_env = run_cli_with_env(args, Some(B::url(&db))).await.json();
    assert_eq!(from_env["outbox_pending"], 2, "{from_env}");
}

/// Outbox rows can hold any timestamp (a bad clock, a hand-written row):
/// `status` reports a lag for each without overflowing, a huge one in hours
/// and a future one as none.
async fn status_shows_a_sane_lag_for_any_timestamp<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    // `status` takes the oldest pending message to be the one with the
    // lowest id (ids are UUIDv7s): first the i64::MIN one, then, once that
    // is gone, the i64::MAX one.
    insert_outbox(&module, uuid_ago(DAY), i64::MIN, None).await;
    insert_outbox(&module, Uuid::now_v7(), i64::MAX, None).await;

    // The oldest is i64::MIN: some 292,000 years ago.
    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 2, "{stats}");
    assert_eq!(stats["oldest_pending_us"], i64::MIN, "{stats}");
    let lag = stats["lag_seconds"].as_f64().expect("a lag");
    assert!(lag.is_finite() && lag > 9.0e12, "lag {lag}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox lag       2562047788h "), "{out}");
    // Beyond the calendar: shown as the number it is.
    assert!(
        out.contains("published -9223372036854775808 µs from the Unix epoch"),
        "{out}"
    );

    // The oldest is i64::MAX: published in the future, so no lag.
    execute(
        &module,
        format!(
            "DELETE FROM tickbox_outbox WHERE created_at_us = {}",
            i64::MIN
        ),
    )
    .await;
    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 1, "{stats}");
    assert_eq!(stats["oldest_pending_us"], i64::MAX, "{stats}");
    assert_eq!(stats["lag_seconds"], 0.0, "{stats}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox lag       0s "), "{out}");
    assert!(
        out.contains("9223372036854775807 µs from the Unix epoch, beyond the years -9999 to 9999, in the future"),
        "{out}"
    );
}

async fn dead_letters_are_listed_and_shown<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let empty = on::<B>(&db, &["dead-letters", "list"]).await;
    assert_eq!(empty.ok(), "no dead letters\n");
    assert_eq!(
        on::<B>(&db, &["--json", "dead-letters", "list"])
            .await
            .json(),
        serde_json::json!([])
    );

    let long_reason = format!(
        "handler failed: {}\nsecond line END-OF-REASON",
        "the warehouse refused the reservation ".repeat(3)
    );
    let first = Dead {
        payload: "{\"n\":1,\"note\":\"fragile\"}",
        reason: &long_reason,
        attempts: 10,
        dead_at_us: NEW_YEAR_US,
        ..Dead::ping(uuid_ago(DAY))
    };
    let unknown = Dead {
        handler: "",
        topic: "cli.unknown",
        payload: "{\"n\":2}",
        reason: "no module on the bus declares topic cli.unknown",
        attempts: 1,
        dead_at_us: NEW_YEAR_US + 1_000_000,
        ..Dead::ping(uuid_ago(DAY))
    };
    let garbled = Dead {
        payload: "not json at all",
        reason: "cannot decode payload",
        attempts: 1,
        dead_at_us: NEW_YEAR_US + 2_000_000,
        ..Dead::ping(uuid_ago(DAY))
    };
    for dead in [&first, &unknown, &garbled] {
        insert_dead(&module, dead).await;
    }
    let (first_id, unknown_id, garbled_id) = (
        first.id.to_string(),
        unknown.id.to_string(),
        garbled.id.to_string(),
    );

    // The table.
    let list = on::<B>(&db, &["dead-letters", "list"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("MODULE "), "{out}");
    for header in [
        "MESSAGE ID",
        "HANDLER",
        "TOPIC",
        "ATTEMPTS",
        "DEAD AT (UTC)",
        "REASON",
    ] {
        assert!(lines[0].contains(header), "{out}");
    }
    assert!(lines[1].starts_with("orders "), "the module: {out}");
    assert!(lines[1].contains(&first_id), "oldest first: {out}");
    assert!(lines[1].contains("orders.ping"), "{out}");
    assert!(lines[1].contains("2026-01-01T00:00:00Z"), "{out}");
    assert!(lines[1].contains(" 10 "), "{out}");
    assert!(lines[1].contains("handler failed: the warehouse"), "{out}");
    assert!(lines[1].ends_with("..."), "a long reason is cut: {out}");
    assert!(!out.contains("END-OF-REASON"), "{out}");
    assert!(lines[2].contains(&unknown_id), "{out}");
    assert!(lines[2].contains(" - "), "no handler shows as -: {out}");
    assert!(lines[2].contains("cli.unknown"), "{out}");
    assert!(lines[2].contains("2026-01-01T00:00:01Z"), "{out}");
    assert!(lines[3].contains(&garbled_id), "{out}");
    assert!(out.ends_with("\n3 dead letters\n"), "{out}");

    let json = on::<B>(&db, &["--json", "dead-letters", "list"])
        .await
        .json();
    let all = json.as_array().expect("an array");
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["message_id"], first_id.as_str());
    assert_eq!(all[0]["module"], "orders");
    assert_eq!(all[0]["handler"], "orders.ping");
    assert_eq!(all[0]["reason"], long_reason.as_str());
    assert_eq!(all[0]["dead_at_us"], NEW_YEAR_US);
    assert_eq!(all[1]["handler"], "");
    assert_eq!(all[2]["payload"], "not json at all");

    // Paging.
    let page = on::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "list",
            "--offset",
            "1",
            "--limit",
            "1",
        ],
    )
    .await
    .json();
    assert_eq!(page.as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page[0]["message_id"], unknown_id.as_str());
    let page = on::<B>(&db, &["dead-letters", "list", "--offset=1", "--limit=1"]).await;
    let out = page.ok();
    assert!(out.contains(&unknown_id), "{out}");
    assert!(
        !out.contains(&first_id) && !out.contains(&garbled_id),
        "{out}"
    );
    assert!(
        out.contains("dead letters 2-2 of 3; next page: --offset 2 --limit 1"),
        "{out}"
    );
    let past = on::<B>(&db, &["dead-letters", "list", "--offset", "9"]).await;
    assert!(past.ok().contains("there are 3"), "{past:#?}");

    // One in full: the payload pretty-printed, the whole reason.
    let show = on::<B>(&db, &["dead-letters", "show", &first_id, "orders.ping"]).await;
    let out = show.ok();
    assert!(
        out.contains(&format!("message id       {first_id}")),
        "{out}"
    );
    assert!(out.contains("handler          orders.ping"), "{out}");
    assert!(out.contains("topic            cli.ping"), "{out}");
    assert!(out.contains("attempts         10"), "{out}");
    assert!(
        out.contains("dead at          2026-01-01T00:00:00.000000Z"),
        "{out}"
    );
    assert!(out.contains("END-OF-REASON"), "{out}");
    assert!(out.contains("payload (JSON)"), "{out}");
    assert!(
        out.contains(
            "payload (JSON)\n    {\n      \"n\": 1,\n      \"note\": \"fragile\"\n    }\n"
        ),
        "pretty, in the stored key order: {out}"
    );

    // The dead letter without a handler, written as -, '' or an empty
    // argument (what the shell makes of '').
    for handler in ["-", "''", ""] {
        let show = on::<B>(&db, &["dead-letters", "show", &unknown_id, handler]).await;
        let out = show.ok();
        assert!(out.contains("topic            cli.unknown"), "{out}");
        assert!(out.contains("handler          - (none"), "{out}");
    }
    let json = on::<B>(&db, &["--json", "dead-letters", "show", &unknown_id, "-"])
        .await
        .json();
    assert_eq!(json["message_id"], unknown_id.as_str());
    assert_eq!(json["topic"], "cli.unknown");
    assert_eq!(json["payload"], "{\"n\":2}");
    assert_eq!(json["attempts"], 1);

    let show = on::<B>(&db, &["dead-letters", "show", &garbled_id, "orders.ping"]).await;
    let out = show.ok();
    assert!(out.contains("not valid JSON"), "{out}");
    assert!(out.contains("    not json at all\n"), "{out}");

    // The trace the message was published in: its id, to search for.
    #[cfg(feature = "opentelemetry")]
    {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        execute(
            &module,
            format!(
                "UPDATE tickbox_dead_letters SET trace_context = '{traceparent}' \
                 WHERE message_id = {}",
                B::uuid_literal(first.id)
            ),
        )
        .await;
        let show = on::<B>(&db, &["dead-letters", "show", &first_id, "orders.ping"]).await;
        let out = show.ok();
        assert!(
            out.contains(
                "trace id         4bf92f3577b34da6a3ce929d0e0e4736 (published in span 00f067aa0ba902b7)\n"
            ),
            "{out}"
        );
        let json = on::<B>(
            &db,
            &["--json", "dead-letters", "show", &first_id, "orders.ping"],
        )
        .await
        .json();
        assert_eq!(json["trace_context"]["traceparent"], traceparent, "{json}");
        let show = on::<B>(&db, &["dead-letters", "show", &unknown_id, "-"]).await;
        let out = show.ok();
        assert!(
            out.contains("trace id         - (none: published outside any trace)\n"),
            "{out}"
        );
    }

    // Not there: the wrong handler, an unknown id.
    on::<B>(&db, &["dead-letters", "show", &first_id, "orders.other"])
        .await
        .fails(1, "no dead letter for message");
    let missing = Uuid::now_v7().to_string();
    on::<B>(&db, &["dead-letters", "show", &missing, "-"])
        .await
        .fails(1, &missing);
    on::<B>(&db, &["dead-letters", "show", "not-a-uuid", "-"])
        .await
        .fails(2, "not a message id");
}

async fn replay_requeues_and_the_bus_redelivers<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let failed = Dead::ping(uuid_ago(Duration::from_secs(60)));
    // A message whose topic nobody declared when it was published; the
    // module declares it now.
    let unknown = Dead {
        handler: "",
        reason: "no module on the bus declares topic cli.ping",
        ..Dead::ping(uuid_ago(Duration::from_secs(60)))
    };
    insert_dead(&module, &failed).await;
    insert_dead(&module, &unknown).await;
    let before = status::<B>(&db).await;
    assert_eq!(before["outbox_pending"], 0, "{before}");
    assert_eq!(before["dead_letters"], 2, "{before}");

    let failed_id = failed.id.to_string();
    let replay = on::<B>(&db, &["dead-letters", "replay", &failed_id, "orders.ping"]).await;
    let out = replay.ok();
    assert!(
        out.contains(&format!("requeued message {failed_id}")),
        "{out}"
    );
    assert!(out.contains("back in the outbox as pending"), "{out}");
    assert!(out.contains("next outbox scan"), "{out}");
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 1, "pending +1: {after}");
    assert_eq!(after["dead_letters"], 1, "dead letters -1: {after}");
    assert!(
        after["lag_seconds"].as_f64().expect("a lag") >= 60.0,
        "{after}"
    );

    let unknown_id = unknown.id.to_string();
    let json = on::<B>(&db, &["--json", "dead-letters", "replay", &unknown_id, "-"])
        .await
        .json();
    assert_eq!(json["requeued"], true, "{json}");
    assert_eq!(json["message_id"], unknown_id.as_str());
    assert_eq!(json["handler"], "");
    assert_eq!(json["topic"], "cli.ping");
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 2, "{after}");
    assert_eq!(after["dead_letters"], 0, "{after}");

    // Replayed once; a second replay finds nothing.
    on::<B>(&db, &["dead-letters", "replay", &failed_id, "orders.ping"])
        .await
        .fails(1, "no dead letter for message");

    // The application's bus delivers both on its scan.
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("bus starts");
    eventually("the requeued messages are handled", || async {
        let stats = module.store_stats().await.expect("stats");
        stats.outbox_pending == 0 && stats.inbox_rows == 2
    })
    .await;
    bus.stop().await;
    let done = status::<B>(&db).await;
    assert_eq!(done["outbox_pending"], 0, "{done}");
    assert_eq!(done["inbox_rows"], 2, "{done}");
    assert_eq!(done["dead_letters"], 0, "{done}");
}

async fn discard_requires_yes<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let dead = Dead::ping(Uuid::now_v7());
    let unknown = Dead {
        handler: "",
        ..Dead::ping(Uuid::now_v7())
    };
    insert_dead(&module, &dead).await;
    insert_dead(&module, &unknown).await;
    let id = dead.id.to_string();

    on::<B>(&db, &["dead-letters", "discard", &id, "orders.ping"])
        .await
        .fails(2, "--yes");
    assert_eq!(status::<B>(&db).await["dead_letters"], 2, "nothing deleted");

    let discard = on::<B>(
        &db,
        &["dead-letters", "discard", &id, "orders.ping", "--yes"],
    )
    .await;
    let out = discard.ok();
    assert!(
        out.contains(&format!("discarded the dead letter of message {id}")),
        "{out}"
    );
    let after = status::<B>(&db).await;
    assert_eq!(after["dead_letters"], 1, "{after}");
    assert_eq!(after["outbox_pending"], 0, "not requeued: {after}");

    on::<B>(&db, &["dead-letters", "discard", &id, "orders.ping", "-y"])
        .await
        .fails(1, "no dead letter for message");

    let unknown_id = unknown.id.to_string();
    let json = on::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "discard",
            "--yes",
            &unknown_id,
            "''",
        ],
    )
    .await
    .json();
    assert_eq!(json["discarded"], true, "{json}");
    assert_eq!(json["handler"], "");
    assert_eq!(status::<B>(&db).await["dead_letters"], 0);
}

async fn a_parked_key_is_shown_and_skipping_its_dead_letter_lets_it_move_on<B: CliBackend>(db: Db) {
    static REFUSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);
    let module = B::module(&db)
        .publishes::<CliPing>()
        .handler(
            "orders.ping",
            Refuse {
                n: 1,
                switch: &REFUSING,
            },
        )
        .start()
        .await
        .expect("the orders module starts");
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("bus starts");
    for n in 1..=3 {
        module
            .transaction(async move |tx| tx.publish_keyed("k", &CliPing::new(n)))
            .await
            .expect("publish");
    }
    eventually("the refused message parks its key", || async {
        module
            .dead_letters(0, 10)
            .await
            .expect("dead letters")
            .len()
            == 3
    })
    .await;
    bus.stop().await;
    let dead = module.dead_letters(0, 10).await.expect("dead letters");
    let head = dead
        .iter()
        .find(|d| d.parked_behind.is_none())
        .expect("the refused one")
        .message_id
        .to_string();

    let before = status::<B>(&db).await;
    assert_eq!(
        before["parked_keys"],
        serde_json::json!([["orders.ping", 1]]),
        "{before}"
    );
    let text = on::<B>(&db, &["status"]).await;
    let text = text.ok();
    assert!(
        text.contains("parked keys      1 key by handler `orders.ping`"),
        "{text}"
    );
    let list = on::<B>(&db, &["dead-letters", "list"]).await;
    let list = list.ok();
    assert!(
        list.contains("k #1") && list.contains("k #3 (parked)"),
        "{list}"
    );
    let show = on::<B>(&db, &["dead-letters", "show", &head, "orders.ping"]).await;
    let show = show.ok();
    assert!(show.contains("ordering key     k (sequence 1"), "{show}");

    on::<B>(&db, &["dead-letters", "skip", &head, "orders.ping"])
        .await
        .fails(2, "--yes");
    let json = on::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "skip",
            &head,
            "orders.ping",
            "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(json["skipped"], true, "{json}");
    assert_eq!(json["ordering_key"], "k", "{json}");
    let after = status::<B>(&db).await;
    assert_eq!(after["dead_letters"], 0, "{after}");
    assert_eq!(after["parked_keys"], serde_json::json!([]), "{after}");
    assert_eq!(
        after["outbox_pending"], 2,
        "the parked two are back: {after}"
    );

    // The application's bus delivers them, in the key's order.
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("bus starts");
    eventually("the two parked messages are handled", || async {
        let stats = module.store_stats().await.expect("stats");
        stats.outbox_pending == 0 && stats.inbox_rows == 2
    })
    .await;
    bus.stop().await;
    assert!(module
        .dead_letters(0, 10)
        .await
        .expect("dead letters")
        .is_empty());
}

async fn sweep_deletes_old_rows_and_keeps_recent_ones<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let old_us = micros_ago(2 * 7 * DAY);
    let now_us = micros_ago(Duration::ZERO);
    // Two weeks old: two inbox rows, a delivered and a pending outbox row.
    insert_inbox(&module, uuid_ago(2 * 7 * DAY), "orders.ping", old_us).await;
    insert_inbox(&module, uuid_ago(2 * 7 * DAY), "orders.audit", old_us).await;
    insert_outbox(&module, uuid_ago(2 * 7 * DAY), old_us, Some(old_us)).await;
    insert_outbox(&module, uuid_ago(2 * 7 * DAY), old_us, None).await;
    // Recent: an inbox row and a delivered outbox row.
    insert_inbox(&module, Uuid::now_v7(), "orders.ping", now_us).await;
    insert_outbox(&module, Uuid::now_v7(), now_us, Some(now_us)).await;
    // Dead letters are never swept.
    insert_dead(
        &module,
        &Dead {
            dead_at_us: old_us,
            ..Dead::ping(uuid_ago(2 * 7 * DAY))
        },
    )
    .await;

    let kept = on::<B>(
        &db,
        &[
            "--json",
            "sweep",
            "--inbox-retention",
            "never",
            "--outbox-retention",
            "never",
        ],
    )
    .await
    .json();
    assert_eq!(
        kept,
        serde_json::json!({
            "module": "orders",
            "inbox_rows": 0,
            "outbox_rows": 0,
            "effect_rows": 0,
            "inbox_retention_seconds": null,
            "outbox_retention_seconds": null,
        })
    );
    assert_eq!(status::<B>(&db).await["inbox_rows"], 3);

    // The default retention, seven days.
    let sweep = on::<B>(&db, &["sweep"]).await;
    let out = sweep.ok();
    assert!(
        out.contains("inbox   deleted 2 rows processed more than 7d ago"),
        "{out}"
    );
    assert!(
        out.contains("outbox  deleted 1 row delivered more than 7d ago"),
        "{out}"
    );
    assert!(
        out.contains("effects deleted 0 rows settled more than 7d ago"),
        "{out}"
    );
    let after = status::<B>(&db).await;
    assert_eq!(after["inbox_rows"], 1, "the recent row stays: {after}");
    assert_eq!(after["outbox_pending"], 1, "the pending row stays: {after}");
    assert_eq!(after["dead_letters"], 1, "{after}");
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.inbox_rows, 1);

    let again = on::<B>(
        &db,
        &[
            "sweep",
            "--json",
            "--inbox-retention=30d",
            "--outbox-retention",
            "1h30m",
        ],
    )
    .await
    .json();
    assert_eq!(
        again,
        serde_json::json!({
            "module": "orders",
            "inbox_rows": 0,
            "outbox_rows": 0,
            "effect_rows": 0,
            "inbox_retention_seconds": 30 * 24 * 3600,
            "outbox_retention_seconds": 5400,
        })
    );
    on::<B>(&db, &["sweep", "--inbox-retention", "7"])
        .await
        .fails(2, "unit designator");
}

async fn subscriptions_lists_a_stopped_one_with_what_it_owes<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let none = on::<B>(&db, &["subscriptions"]).await;
    assert!(
        none.ok().starts_with("no subscriptions recorded"),
        "{none:#?}"
    );
    assert!(subscriptions::<B>(&db).await.is_empty());

    // An application ran with the handler and stopped; since then two
    // messages were published, the oldest 90 s ago.
    let started_us = micros_ago(Duration::ZERO);
    subscribe_and_stop(&module).await;
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, uuid_ago(Duration::from_secs(90)), oldest_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;

    let list = on::<B>(&db, &["subscriptions"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("OUTBOX "), "{out}");
    for header in [
        "MODULE",
        "HANDLER",
        "TOPIC",
        "STATE",
        "SUBSCRIBED SINCE (UTC)",
        "OLDEST OWED",
    ] {
        assert!(lines[0].contains(header), "{out}");
    }
    assert!(lines[1].starts_with("orders  orders "), "{out}");
    assert!(lines[1].contains(" orders.ping "), "{out}");
    assert!(lines[1].contains(" cli.ping "), "{out}");
    assert!(lines[1].contains(" stopped, last seen "), "{out}");
    // 90 s and a bit: `1m 30s ago`, `1m 31s ago`, ...
    assert!(lines[1].ends_with(" ago"), "{out}");
    assert!(
        lines[1].contains("  1m "),
        "the oldest owed message's age: {out}"
    );
    assert!(
        out.contains("\n1 subscription: 0 alive, 1 stopped\n"),
        "{out}"
    );
    assert!(
        out.contains("tickbox subscriptions retire MODULE HANDLER --yes"),
        "{out}"
    );
    // `subscriptions list` is the same command.
    let again = on::<B>(&db, &["subscriptions", "list"]).await;
    assert!(again.ok().contains(" stopped, last seen "), "{again:#?}");

    let all = subscriptions::<B>(&db).await;
    assert_eq!(all.len(), 1, "{all:?}");
    let one = &all[0];
    assert_eq!(one["module"], "orders", "{one}");
    assert_eq!(one["handler"], "orders.ping", "{one}");
    assert_eq!(one["topic"], "cli.ping", "{one}");
    assert_eq!(one["alive"], false, "{one}");
    assert_eq!(one["oldest_pending_us"], oldest_us, "{one}");
    let lag = one["lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    let subscribed = one["subscribed_at_us"].as_i64().expect("a time");
    assert!(subscribed >= started_us, "{one}");
    let alive_until = one["alive_until_us"].as_i64().expect("a time");
    assert!(alive_until <= micros_ago(Duration::ZERO), "{one}");
}

async fn subscriptions_retire_finishes_only_what_it_alone_owed<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    subscribe_and_stop(&module).await;
    // Three pending messages, owed to both handlers, except that
    // `orders.audit` is done with the first two.
    let ids = [90, 60, 0].map(|s| uuid_ago(Duration::from_secs(s)));
    let newest_us = micros_ago(Duration::ZERO);
    for (id, age) in ids.iter().zip([90, 60, 0]) {
        let created = if age == 0 {
            newest_us
        } else {
            micros_ago(Duration::from_secs(age))
        };
        insert_outbox(&module, *id, created, None).await;
    }
    insert_done(&module, ids[0], "orders.audit").await;
    insert_done(&module, ids[1], "orders.audit").await;
    let before = subscriptions::<B>(&db).await;
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(before[0]["handler"], "orders.audit", "sorted: {before:?}");
    assert_eq!(before[0]["oldest_pending_us"], newest_us, "{before:?}");

    // Without --yes: refused, nothing changes.
    let refused = on::<B>(&db, &["subscriptions", "retire", "orders", "orders.ping"]).await;
    refused.fails(2, "without --yes");
    assert!(refused.stderr.contains("orders.ping"), "{refused:#?}");
    assert_eq!(subscriptions::<B>(&db).await.len(), 2);
    assert_eq!(module.store_stats().await.expect("stats").outbox_pending, 3);

    // Unknown: a clear failure.
    let unknown = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.gone", "--yes"],
    )
    .await;
    unknown.fails(
        1,
        "records no subscription of handler `orders.gone` of module `orders`",
    );
    assert!(
        unknown
            .stderr
            .contains("`tickbox subscriptions` lists them"),
        "{unknown:#?}"
    );
    on::<B>(
        &db,
        &["subscriptions", "retire", "billing", "orders.ping", "--yes"],
    )
    .await
    .fails(1, "of module `billing`");

    // Retired: the two messages only it still owed are finished; the third
    // stays pending for `orders.audit`.
    let retire = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    let out = retire.ok();
    assert!(
        out.contains(
            "retired the subscription of handler `orders.ping` of module `orders` (topic cli.ping)"
        ),
        "{out}"
    );
    assert!(
        out.contains("2 messages that only it still owed were marked delivered"),
        "{out}"
    );
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.outbox_pending, 1, "{stats:?}");
    assert_eq!(stats.oldest_pending_us, Some(newest_us), "{stats:?}");
    let left = subscriptions::<B>(&db).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["handler"], "orders.audit", "{left:?}");
    assert_eq!(left[0]["oldest_pending_us"], newest_us, "{left:?}");
    assert_eq!(status::<B>(&db).await["outbox_pending"], 1);

    // Once retired, it is unknown.
    on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "-y"],
    )
    .await
    .fails(1, "records no subscription of handler `orders.ping`");

    // The last subscription of its topic: nobody else owes its message, so
    // it is finished too.
    let text = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.audit", "--yes"],
    )
    .await;
    let out = text.ok();
    assert!(
        out.contains("1 message that only it still owed was marked delivered"),
        "{out}"
    );
    assert!(
        out.contains("No subscription of topic cli.ping is left"),
        "{out}"
    );
    assert_eq!(module.store_stats().await.expect("stats").outbox_pending, 0);
    assert!(subscriptions::<B>(&db).await.is_empty());
}

/// `--json subscriptions retire`.
async fn subscriptions_retire_with_json<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    subscribe_and_stop(&module).await;
    let id = uuid_ago(Duration::from_secs(10));
    insert_outbox(&module, id, micros_ago(Duration::from_secs(10)), None).await;
    insert_done(&module, id, "orders.ping").await;
    let json = on::<B>(
        &db,
        &[
            "--json",
            "subscriptions",
            "retire",
            "--yes",
            "orders",
            "orders.audit",
        ],
    )
    .await
    .json();
    assert_eq!(
        json,
        serde_json::json!({
            "outbox": "orders",
            "module": "orders",
            "handler": "orders.audit",
            "topic": "cli.ping",
            "retired": true,
            "finished": 1,
            "topic_subscriptions_left": 1,
        })
    );
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.outbox_pending, 0, "{stats:?}");
    let left = subscriptions::<B>(&db).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["handler"], "orders.ping", "{left:?}");
    assert_eq!(left[0]["oldest_pending_us"], Value::Null, "{left:?}");
}

async fn subscriptions_retire_is_refused_while_a_process_serves_it<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("the bus starts");

    let list = on::<B>(&db, &["subscriptions"]).await;
    let out = list.ok();
    assert!(out.contains(" alive, seen "), "{out}");
    assert!(
        out.contains("\n1 subscription: 1 alive, 0 stopped\n"),
        "{out}"
    );
    let all = subscriptions::<B>(&db).await;
    assert_eq!(all[0]["alive"], true, "{all:?}");
    assert_eq!(all[0]["oldest_pending_us"], Value::Null, "{all:?}");
    assert_eq!(all[0]["lag_seconds"], Value::Null, "{all:?}");
    let text = on::<B>(&db, &["status"]).await;
    assert!(
        text.ok()
            .contains("subscriptions    1: 1 alive, 0 stopped\n"),
        "{text:#?}"
    );

    let refused = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    refused.fails(
        1,
        "handler `orders.ping` of module `orders` is still served by a running process",
    );
    assert!(refused.stderr.contains("stop that process"), "{refused:#?}");
    assert_eq!(subscriptions::<B>(&db).await.len(), 1, "still recorded");

    // Once its process stops, it can be retired.
    bus.stop().await;
    eventually("the subscription is recorded as stopped", || async {
        let now = micros_ago(Duration::ZERO);
        let recorded = module.subscriptions().await.expect("subscriptions");
        recorded.iter().all(|s| !s.is_alive(now))
    })
    .await;
    let retire = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    assert!(
        retire
            .ok()
            .contains("0 messages that only it still owed were marked delivered"),
        "{retire:#?}"
    );
    assert!(subscriptions::<B>(&db).await.is_empty());
}

async fn status_shows_subscriptions_and_stalled_messages<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    let empty = status::<B>(&db).await;
    assert_eq!(empty["stalled"], 0, "{empty}");
    assert_eq!(empty["stalled_after_seconds"], 60, "{empty}");
    assert_eq!(empty["subscriptions_alive"], 0, "{empty}");
    assert_eq!(empty["subscriptions_stopped"], 0, "{empty}");
    assert_eq!(empty["subscription_lag_seconds"], Value::Null, "{empty}");
    assert_eq!(empty["lagging_subscription"], Value::Null, "{empty}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(
        out.contains("outbox stalled   0 messages pending longer than 1m\n"),
        "{out}"
    );
    assert!(out.contains("subscriptions    none recorded"), "{out}");

    // Both handlers subscribed, then their process stopped; three messages
    // are pending, 90 s, 30 s and no time old; `orders.audit` is done with
    // the oldest, so `orders.ping` is owed the oldest message.
    subscribe_and_stop(&module).await;
    let ninety = uuid_ago(Duration::from_secs(90));
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, ninety, oldest_us, None).await;
    let thirty_us = micros_ago(Duration::from_secs(30));
    insert_outbox(&module, uuid_ago(Duration::from_secs(30)), thirty_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;
    insert_done(&module, ninety, "orders.audit").await;

    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 3, "{stats}");
    assert_eq!(stats["stalled"], 1, "pending for over 60 s: {stats}");
    assert_eq!(stats["subscriptions_alive"], 0, "{stats}");
    assert_eq!(stats["subscriptions_stopped"], 2, "{stats}");
    let lag = stats["subscription_lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    assert_eq!(
        stats["lagging_subscription"],
        serde_json::json!({ "module": "orders", "handler": "orders.ping" })
    );

    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(
        out.contains("outbox stalled   1 message pending longer than 1m"),
        "{out}"
    );
    assert!(
        out.contains("subscriptions    2: 0 alive, 2 stopped  (see `tickbox subscriptions`)\n"),
        "{out}"
    );
    assert!(out.contains("subscription lag 1m "), "{out}");
    assert!(
        out.contains("(handler `orders.ping` of module `orders`, stopped)\n"),
        "{out}"
    );

    // Another threshold counts other messages.
    let shorter = on::<B>(&db, &["--json", "status", "--stalled-after", "20s"])
        .await
        .json();
    assert_eq!(shorter["stalled"], 2, "{shorter}");
    assert_eq!(shorter["stalled_after_seconds"], 20, "{shorter}");
    let longer = on::<B>(&db, &["status", "--stalled-after=1h"]).await;
    assert!(
        longer
            .ok()
            .contains("outbox stalled   0 messages pending longer than 1h\n"),
        "{longer:#?}"
    );
    on::<B>(&db, &["status", "--stalled-after", "0s"])
        .await
        .fails(2, "above zero");

    // `orders.ping` retired: the oldest message is finished, and
    // `orders.audit`, owed the 30 s old one, lags most.
    on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await
    .ok();
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 2, "{after}");
    assert_eq!(after["stalled"], 0, "{after}");
    assert_eq!(after["subscriptions_stopped"], 1, "{after}");
    let lag = after["subscription_lag_seconds"].as_f64().expect("a lag");
    assert!((30.0..90.0).contains(&lag), "lag {lag}");
    assert_eq!(
        after["lagging_subscription"],
        serde_json::json!({ "module": "orders", "handler": "orders.audit" })
    );
}

async fn scheduled_messages_are_listed_shown_and_cancelled<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    assert_eq!(
        on::<B>(&db, &["scheduled", "list"]).await.ok(),
        "no scheduled messages\n"
    );
    let schedule = async |delay: Duration, n: u64| {
        module
            .transaction(async move |tx| tx.publish_after(delay, &CliPing::new(n)))
            .await
            .expect("publish commits")
    };
    let tomorrow = schedule(Duration::from_secs(86_400), 1).await;
    let in_an_hour = schedule(Duration::from_secs(3600), 2).await;
    let keyed = module
        .transaction(async move |tx| {
            tx.publish_keyed_after("order-7", Duration::from_secs(7200), &CliPing::new(3))
        })
        .await
        .expect("publish commits");

    // Soonest first.
    let list = on::<B>(&db, &["scheduled", "list"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].contains("MESSAGE ID") && lines[0].contains("DUE AT (UTC)"),
        "{out}"
    );
    assert!(lines[1].contains(&in_an_hour.to_string()), "{out}");
    assert!(
        lines[2].contains(&keyed.to_string()) && lines[2].contains("order-7"),
        "{out}"
    );
    assert!(lines[3].contains(&tomorrow.to_string()), "{out}");
    assert!(out.ends_with("3 scheduled messages\n"), "{out}");
    let json = on::<B>(
        &db,
        &["--json", "scheduled", "list", "--offset=1", "--limit=1"],
    )
    .await
    .json();
    assert_eq!(json.as_array().map(Vec::len), Some(1), "{json}");
    assert_eq!(json[0]["message_id"], keyed.to_string());
    assert_eq!(json[0]["ordering_key"], "order-7");
    assert_eq!(json[0]["module"], "orders");
    let before = status::<B>(&db).await;
    assert_eq!(before["outbox_scheduled"], 3, "{before}");
    assert_eq!(
        before["outbox_pending"], 0,
        "waiting is not pending: {before}"
    );

    let show = on::<B>(&db, &["scheduled", "show", &tomorrow.to_string()]).await;
    let out = show.ok();
    assert!(
        out.contains(&format!("message id       {tomorrow}\n")),
        "{out}"
    );
    assert!(out.contains("topic            cli.ping\n"), "{out}");
    assert!(
        out.contains("(in 23h 59m") || out.contains("(in 1d"),
        "{out}"
    );
    assert!(out.contains("payload (JSON)\n"), "{out}");

    // Cancelling needs --yes, then removes it; a second time finds nothing.
    let id = tomorrow.to_string();
    on::<B>(&db, &["scheduled", "cancel", &id])
        .await
        .fails(2, "--yes");
    assert_eq!(
        status::<B>(&db).await["outbox_scheduled"],
        3,
        "nothing cancelled"
    );
    let cancel = on::<B>(&db, &["scheduled", "cancel", &id, "--yes"]).await;
    assert!(
        cancel
            .ok()
            .contains(&format!("cancelled scheduled message {id}")),
        "{cancel:#?}"
    );
    assert_eq!(status::<B>(&db).await["outbox_scheduled"], 2);
    on::<B>(&db, &["scheduled", "cancel", &id, "--yes"])
        .await
        .fails(1, "no scheduled message");
    on::<B>(&db, &["scheduled", "show", &id])
        .await
        .fails(1, "no scheduled message");
    let json = on::<B>(
        &db,
        &[
            "--json",
            "scheduled",
            "cancel",
            "-y",
            &in_an_hour.to_string(),
        ],
    )
    .await
    .json();
    assert_eq!(json["cancelled"], true, "{json}");
    assert_eq!(status::<B>(&db).await["outbox_scheduled"], 1);
    on::<B>(&db, &["scheduled", "show", "not-a-uuid"])
        .await
        .fails(2, "not-a-uuid");
}

/// Instantiates the generic tests for one backend.
macro_rules! cli_tests {
    ($backend:ty, $db:expr) => {
        crate::support::backend_cases!(
            $backend,
            $db,
            [
                status_counts_what_the_tables_hold,
                status_shows_a_sane_lag_for_any_timestamp,
                dead_letters_are_listed_and_shown,
                replay_requeues_and_the_bus_redelivers,
                discard_requires_yes,
                a_parked_key_is_shown_and_skipping_its_dead_letter_lets_it_move_on,
                sweep_deletes_old_rows_and_keeps_recent_ones,
                subscriptions_lists_a_stopped_one_with_what_it_owes,
                subscriptions_retire_finishes_only_what_it_alone_owed,
                subscriptions_retire_with_json,
                subscriptions_retire_is_refused_while_a_process_serves_it,
                status_shows_subscriptions_and_stalled_messages,
                scheduled_messages_are_listed_shown_and_cancelled,
            ]
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    cli_tests!(tickbox::Sqlite, super::Db::new());

    /// A missing file and a file without tickbox tables.
    #[actix::test]
    async fn bad_databases_fail_with_clear_errors() {
        let db = super::Db::new();
        let missing = db.dir.path().join("missing.db");
        let missing = missing.to_str().expect("UTF-8").to_string();
        let run = super::run_cli(vec![
            "--database-url".into(),
            missing.clone(),
            "status".into(),
        ])
        .await;
        run.fails(1, "cannot open the database");
        assert!(run.stderr.contains(&missing), "{run:#?}");
        assert!(run.stderr.contains("no database file there"), "{run:#?}");
        assert!(!std::path::Path::new(&missing).exists(), "not created");

        let empty = db.dir.path().join("empty.db");
        std::fs::write(&empty, b"").expect("an empty file");
        let empty = format!("sqlite://{}", empty.to_str().expect("UTF-8"));
        for command in [&["status"][..], &["dead-letters", "list"], &["sweep"]] {
            let mut args = vec!["--database-url".to_string(), empty.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            super::run_cli(args).await.fails(1, "has no tickbox tables");
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    cli_tests!(tickbox::Postgres, super::Db::postgres());

    /// An unreachable server, and schemas without tickbox tables.
    #[actix::test]
    async fn bad_databases_fail_with_clear_errors() {
        let db = super::Db::postgres();
        let run = super::run_cli(vec![
            "--database-url".into(),
            "postgres://tickbox:hunter2@127.0.0.1:1/nowhere".into(),
            "status".into(),
        ])
        .await;
        run.fails(1, "cannot reach the database server");
        assert!(run.stderr.contains("127.0.0.1:1"), "{run:#?}");
        assert!(run.stderr.contains("refused the connection"), "{run:#?}");
        assert!(!run.stderr.contains("hunter2"), "password shown: {run:#?}");

        // A schema that does not exist, and one that exists but is empty.
        let url = db.pg_url.clone().expect("a URL");
        let other = super::orders::<tickbox::Postgres>(&db).await;
        let empty = format!("{}_empty", db.schema);
        super::execute(&other, format!("CREATE SCHEMA {empty}")).await;
        for schema in [format!("{}_never", db.schema), empty] {
            let run = super::run_cli(vec![
                "--database-url".into(),
                url.clone(),
                "--schema".into(),
                schema.clone(),
                "dead-letters".into(),
                "list".into(),
            ])
            .await;
            run.fails(1, "has no tickbox tables");
            assert!(run.stderr.contains(&schema), "{run:#?}");
        }

        // A schema name PostgreSQL would need quoted is a usage error.
        let run = super::run_cli(vec![
            "--database-url".into(),
            url,
            "--schema".into(),
            "Orders-Module".into(),
            "status".into(),
        ])
        .await;
        run.fails(2, "schema name `Orders-Module`");
        assert!(
            run.stderr.contains("Usage: tickbox status [OPTIONS]"),
            "{run:#?}"
        );
    }

    /// `status` says whether the tool's own connection is encrypted, in
    /// text and in JSON.
    #[cfg(feature = "tls")]
    #[actix::test]
    async fn status_says_whether_the_connection_is_encrypted() {
        let mut db = super::Db::postgres();
        let base = db.pg_url.clone().expect("a URL");
        let _orders = super::orders::<tickbox::Postgres>(&db).await;
        let separator = if base.contains('?') { '&' } else { '?' };
        for (mode, shown, encrypted) in [
            ("require", "connection       encrypted (TLS)", true),
            ("disable", "connection       in clear (no TLS)", false),
        ] {
            db.pg_url = Some(format!("{base}{separator}sslmode={mode}"));
            let text = super::on::<tickbox::Postgres>(&db, &["status"]).await;
            assert!(text.ok().contains(shown), "{mode}: {text:#?}");
            let json = super::status::<tickbox::Postgres>(&db).await;
            assert_eq!(json["encrypted"], encrypted, "{mode}: {json}");
        }
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    cli_tests!(tickbox::Mysql, super::Db::mysql());

    /// An unreachable server, a database that does not exist, one without
    /// tickbox tables, a URL naming no database, and a database name the
    /// library refuses.
    #[actix::test]
    async fn bad_databases_fail_with_clear_errors() {
        let db = super::Db::mysql();
        let run = super::run_cli(vec![
            "--database-url".into(),
            "mysql://tickbox:hunter2@127.0.0.1:1".into(),
            "--schema".into(),
            "nowhere".into(),
            "status".into(),
        ])
        .await;
        run.fails(1, "cannot reach the database server");
        assert!(run.stderr.contains("127.0.0.1:1"), "{run:#?}");
        assert!(!run.stderr.contains("hunter2"), "password shown: {run:#?}");

        let url = db.mysql_url.clone().expect("a URL");
        let other = super::orders::<tickbox::Mysql>(&db).await;
        let empty = format!("{}_empty", db.schema);
        super::execute(&other, format!("CREATE DATABASE {empty}")).await;
        for (database, error) in [
            (format!("{}_never", db.schema), "Unknown database"),
            (empty, "has no tickbox tables"),
        ] {
            let run = super::run_cli(vec![
                "--database-url".into(),
                url.clone(),
                "--schema".into(),
                database.clone(),
                "dead-letters".into(),
                "list".into(),
            ])
            .await;
            run.fails(1, error);
            assert!(run.stderr.contains(&database), "{run:#?}");
        }

        let run = super::run_cli(vec!["--database-url".into(), url.clone(), "status".into()]).await;
        run.fails(1, "the URL names no database");

        // A database name the library would need quoted is a usage error.
        let run = super::run_cli(vec![
            "--database-url".into(),
            url,
            "--schema".into(),
            "Orders-Module".into(),
            "status".into(),
        ])
        .await;
        run.fails(2, "database name `Orders-Module`");
        assert!(
            run.stderr.contains("Usage: tickbox status [OPTIONS]"),
            "{run:#?}"
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres_passwords {
    use super::run_cli;

    /// The test server's URL with another database and path, e.g.
    /// `postgres://postgres@127.0.0.1:5432/nodb_x?password=S3cret!`.
    fn server_url(path: &str, query: Option<&str>) -> (url::Url, String) {
        let server = super::Db::postgres().pg_url.clone().expect("a URL");
        let mut url = url::Url::parse(&server).expect("TICKBOX_PG_URL parses");
        url.set_path(path);
        url.set_query(query);
        (url.clone(), url.to_string())
    }

    /// A password in the URL's query is never printed, by any command, in
    /// text or with --json, and the error still names the host and the
    /// database.
    #[actix::test]
    async fn a_password_in_the_query_is_never_shown() {
        let (url, text) = server_url("/nodb_x", Some("password=S3cret!"));
        let host = format!(
            "{}:{}",
            url.host_str().expect("a host"),
            url.port().unwrap_or(5432)
        );
        for command in [
            &["status"][..],
            &["--json", "status"],
            &["dead-letters", "list"],
            &["--json", "dead-letters", "list"],
            &["--json", "sweep"],
        ] {
            let mut args = vec!["--database-url".to_string(), text.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            let run = run_cli(args).await;
            run.fails(1, "cannot open the database of module `nodb_x`");
            assert!(!run.stderr.contains("S3cret"), "password shown: {run:#?}");
            assert!(run.stderr.contains(&host), "{command:?}: {run:#?}");
            assert!(
                run.stderr.contains("/nodb_x?password=***"),
                "{command:?}: {run:#?}"
            );
        }
        // The same URL from the environment.
        let run = super::run_cli_with_env(vec!["--json".into(), "status".into()], Some(text)).await;
        run.fails(1, "cannot open the database");
        assert!(!run.stderr.contains("S3cret"), "password shown: {run:#?}");
    }

    /// A raw `/` in a password breaks the URL: nothing after the scheme is
    /// shown, not even as the module's name.
    #[actix::test]
    async fn a_password_that_breaks_the_url_is_never_shown() {
        let (url, _) = server_url("/nodb_x", None);
        let text = format!(
            "postgres://postgres:S3/cret@{}:{}/nodb_x",
            url.host_str().expect("a host"),
            url.port().unwrap_or(5432)
        );
        for command in [&["status"][..], &["--json", "status"]] {
            let mut args = vec!["--database-url".to_string(), text.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            let run = run_cli(args).await;
            assert_eq!(run.code, 1, "{run:#?}");
            assert!(run.stdout.is_empty(), "{run:#?}");
            assert!(!run.stderr.contains("cret"), "password shown: {run:#?}");
            assert!(run.stderr.contains("postgres://***"), "{run:#?}");
        }
    }
}

/// A MariaDB/MySQL URL given to a binary built without MySQL support.
#[cfg(not(feature = "mysql"))]
#[actix::test]
async fn a_mysql_url_needs_the_mysql_feature() {
    run_cli(vec![
        "--database-url".into(),
        "mysql://root@127.0.0.1:3306/shop".into(),
        "status".into(),
    ])
    .await
    .fails(1, "--features mysql");
}

/// A PostgreSQL URL given to a binary built without PostgreSQL support.
#[cfg(not(feature = "postgres"))]
#[actix::test]
async fn a_postgres_url_needs_the_postgres_feature() {
    run_cli(vec![
        "--database-url".into(),
        "postgres://postgres@127.0.0.1:5432/test".into(),
        "status".into(),
    ])
    .await
    .fails(1, "--features postgres");
}
