//! Help pages, the version, and usage errors (exit 2) that never touch a
//! database.

use crate::support::run_cli;
use uuid::Uuid;

fn args(line: &str) -> Vec<String> {
    line.split_whitespace().map(str::to_string).collect()
}

#[actix::test]
async fn help_pages_name_every_command_and_option() {
    for line in ["--help", "-h", "help"] {
        let help = run_cli(args(line)).await;
        let out = help.ok();
        for part in [
            "Usage: tickbox [OPTIONS] <COMMAND>",
            "Commands:",
            "status",
            "subscriptions",
            "dead-letters",
            "effects",
            "sweep",
            "--database-url <URL>",
            "TICKBOX_DATABASE_URL",
            "--schema <NAME>",
            "--data-dir <DIR>",
            "--module <NAME>",
            "--json",
            "Exit status:",
        ] {
            assert!(out.contains(part), "{line}: `{part}` in {out}");
        }
    }
    let long = run_cli(args("--help")).await;
    assert!(
        long.ok().contains("[env: TICKBOX_DATABASE_URL]"),
        "{long:#?}"
    );
    for (line, usage) in [
        ("help status", "Usage: tickbox status [OPTIONS]"),
        ("status --help", "Usage: tickbox status [OPTIONS]"),
        (
            "help dead-letters",
            "Usage: tickbox dead-letters [OPTIONS] <COMMAND>",
        ),
        (
            "dead-letters list -h",
            "Usage: tickbox dead-letters list [OPTIONS]",
        ),
        (
            "help dead-letters show",
            "Usage: tickbox dead-letters show [OPTIONS] <MESSAGE_ID> <HANDLER>",
        ),
        (
            "dead-letters replay --help",
            "Usage: tickbox dead-letters replay [OPTIONS] <MESSAGE_ID> <HANDLER>",
        ),
        (
            "help dead-letters discard",
            "Usage: tickbox dead-letters discard [OPTIONS] <MESSAGE_ID> <HANDLER>",
        ),
        ("help effects", "Usage: tickbox effects [OPTIONS] <COMMAND>"),
        ("effects list -h", "Usage: tickbox effects list [OPTIONS]"),
        (
            "help effects done",
            "Usage: tickbox effects done [OPTIONS] <MESSAGE_ID> <HANDLER> <EFFECT>",
        ),
        (
            "effects retry --help",
            "Usage: tickbox effects retry [OPTIONS] <MESSAGE_ID> <HANDLER> <EFFECT>",
        ),
        ("sweep --help", "Usage: tickbox sweep [OPTIONS]"),
        (
            "help subscriptions",
            "Usage: tickbox subscriptions [OPTIONS] [COMMAND]",
        ),
        (
            "subscriptions --help",
            "Usage: tickbox subscriptions [OPTIONS] [COMMAND]",
        ),
        (
            "subscriptions list -h",
            "Usage: tickbox subscriptions list [OPTIONS]",
        ),
        (
            "help subscriptions retire",
            "Usage: tickbox subscriptions retire [OPTIONS] <MODULE> <HANDLER>",
        ),
    ] {
        let help = run_cli(args(line)).await;
        let out = help.ok();
        assert!(out.contains(usage), "{line}: `{usage}` in {out}");
        // The global options apply to every command.
        assert!(out.contains("--database-url <URL>"), "{line}: {out}");
    }
    let pages = [
        ("help dead-letters discard", "-y, --yes"),
        ("help dead-letters show", "- or ''"),
        ("help dead-letters list", "--offset <N>"),
        ("help dead-letters list", "[default: 50]"),
        ("help sweep", "--inbox-retention <DURATION>"),
        ("help sweep", "[default: 7d]"),
        ("help status", "--stalled-after <DURATION>"),
        ("help status", "[default: 60s]"),
        ("help subscriptions retire", "-y, --yes"),
        ("help status", "stalled_after_seconds"),
        ("help status", "unknown_effects"),
        ("help effects list", "--state <STATE>"),
        ("help effects list", "[default: 50]"),
        ("help effects done", "--result <JSON>"),
        ("help effects done", "[default: null]"),
        ("help effects done", "-y, --yes"),
        ("help effects retry", "-y, --yes"),
    ];
    for (line, part) in pages {
        let help = run_cli(args(line)).await;
        assert!(help.ok().contains(part), "{line}: `{part}` in {help:#?}");
    }

    let version = run_cli(args("--version")).await;
    assert_eq!(
        version.ok(),
        format!("tickbox {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[actix::test]
async fn usage_errors_exit_2_and_touch_no_database() {
    // No command: the help, on stderr.
    for line in [
        "",
        "--database-url x.db",
        "--database-url x.db dead-letters",
    ] {
        let run = run_cli(args(line)).await;
        assert_eq!(run.code, 2, "{line}: {run:#?}");
        assert!(run.stdout.is_empty(), "{line}: {run:#?}");
        assert!(run.stderr.contains("Usage: tickbox"), "{line}: {run:#?}");
    }

    let id = Uuid::now_v7().to_string();
    for (line, needle) in [
        (
            "--database-url x.db frobnicate",
            "unrecognized subcommand 'frobnicate'",
        ),
        (
            "--database-url x.db status --verbose",
            "unexpected argument '--verbose'",
        ),
        ("status", "TICKBOX_DATABASE_URL"),
        (
            "--database-url",
            "a value is required for '--database-url <URL>'",
        ),
        (
            "--database-url x.db status extra",
            "unexpected argument 'extra'",
        ),
        (
            "--database-url x.db status --yes",
            "unexpected argument '--yes'",
        ),
        (
            "--database-url x.db dead-letters purge",
            "unrecognized subcommand 'purge'",
        ),
        ("--database-url x.db dead-letters show", "<MESSAGE_ID>"),
        (
            "--database-url x.db dead-letters show 42 h",
            "not a message id",
        ),
        (
            "--database-url x.db dead-letters list --limit many",
            "--limit <N>",
        ),
        (
            "--database-url x.db sweep --inbox-retention 0s",
            "above zero",
        ),
        (
            "--database-url x.db sweep --outbox-retention 3y",
            "weeks or less",
        ),
        (
            "--database-url x.db --schema s status",
            "MariaDB/MySQL (a database) only",
        ),
        (
            "--database-url mongodb://h/db status",
            "neither an SQLite path",
        ),
        (
            "--data-dir shop --schema s1 status",
            "--schema applies to PostgreSQL (a schema) and MariaDB/MySQL (a database) only",
        ),
        ("help frobnicate", "unrecognized subcommand 'frobnicate'"),
        (
            "--database-url x.db subscriptions purge",
            "unrecognized subcommand 'purge'",
        ),
        (
            "--database-url x.db subscriptions retire orders",
            "<HANDLER>",
        ),
        (
            "--database-url x.db subscriptions --offset 3",
            "unexpected argument '--offset'",
        ),
        (
            "--database-url x.db status --stalled-after never",
            "not never",
        ),
        (
            "--database-url x.db sweep --stalled-after 1m",
            "unexpected argument '--stalled-after'",
        ),
    ] {
        let run = run_cli(args(line)).await;
        run.fails(2, needle);
        assert!(
            run.stderr.contains("For more information, try '--help'."),
            "{line}: {run:#?}"
        );
    }
    let discard = run_cli(args(&format!(
        "--database-url x.db dead-letters discard {id} orders.ping"
    )))
    .await;
    discard.fails(2, "without --yes");
    assert!(
        discard
            .stderr
            .contains("Usage: tickbox dead-letters discard"),
        "{discard:#?}"
    );
    let retire = run_cli(args(
        "--database-url x.db subscriptions retire orders orders.ping",
    ))
    .await;
    retire.fails(2, "without --yes");
    assert!(
        !std::path::Path::new("x.db").exists(),
        "no database was touched"
    );
}

/// The `effects` commands' bad input: a usage error (exit 2) before any
/// database is opened.
#[actix::test]
async fn effects_usage_errors_exit_2_and_touch_no_database() {
    let id = Uuid::now_v7().to_string();
    for (line, needle) in [
        (
            "--database-url x.db effects list --state lost".to_string(),
            "`lost` is not an effect state (started, succeeded, failed, unknown, retry)",
        ),
        (
            "--database-url x.db effects list --state".to_string(),
            "a value is required for '--state <STATE>'",
        ),
        (
            "--database-url x.db effects done 42 orders.notify notify --yes".to_string(),
            "not a message id",
        ),
        (
            "--database-url x.db effects retry not-a-uuid orders.notify notify --yes".to_string(),
            "not a message id",
        ),
        (
            format!(
                "--database-url x.db effects done {id} orders.notify notify --result {{oops --yes"
            ),
            "not valid JSON",
        ),
        (
            format!("--database-url x.db effects done {id} orders.notify notify --result ok --yes"),
            "a string needs its quotes",
        ),
        (
            format!("--database-url x.db effects retry {id} orders.notify"),
            "<EFFECT>",
        ),
        (
            format!("--database-url x.db effects retry {id} orders.notify notify --result 1 --yes"),
            "unexpected argument '--result'",
        ),
        (
            "--database-url x.db effects purge".to_string(),
            "unrecognized subcommand 'purge'",
        ),
    ] {
        let run = run_cli(args(&line)).await;
        run.fails(2, needle);
        assert!(
            run.stderr.contains("For more information, try '--help'."),
            "{line}: {run:#?}"
        );
    }
    for (settle, why) in [
        ("done", "as done without --yes"),
        ("retry", "as retry without --yes"),
    ] {
        let run = run_cli(args(&format!(
            "--database-url x.db effects {settle} {id} orders.notify notify"
        )))
        .await;
        run.fails(2, why);
        assert!(
            run.stderr.contains(&format!(
                "refusing to settle effect `notify` of handler `orders.notify` for message {id}"
            )),
            "{run:#?}"
        );
        assert!(
            run.stderr
                .contains(&format!("Usage: tickbox effects {settle} [OPTIONS]")),
            "{run:#?}"
        );
    }
    let empty = run_cli(vec![
        "--database-url".into(),
        "x.db".into(),
        "effects".into(),
        "retry".into(),
        id.clone(),
        String::new(),
        "notify".into(),
        "--yes".into(),
    ])
    .await;
    empty.fails(2, "<HANDLER>");
    assert!(
        !std::path::Path::new("x.db").exists(),
        "no database was touched"
    );
}

#[actix::test]
async fn a_password_in_a_misplaced_url_is_never_shown() {
    for line in [
        "--database-url x.db postgres://u:S3cret@h/db",
        "--database-url x.db status postgres://u:S3cret@h/db",
        "--database-url x.db status -postgres://u:S3cret@h/db",
        "--database-url mongodb://u:S3cret@h/db status",
        "help postgres://u:S3cret@h/db",
    ] {
        let run = run_cli(args(line)).await;
        assert_eq!(run.code, 2, "{line}: {run:#?}");
        assert!(!run.stderr.contains("S3cret"), "{line}: {run:#?}");
    }
    // Nor the one of the URL in the environment, in the help.
    let with_env = crate::support::run_cli_with_env(
        args("status --help"),
        Some("postgres://u:S3cret@h/db".into()),
    )
    .await;
    assert!(!with_env.ok().contains("S3cret"), "{with_env:#?}");
}

/// A database URL of any shape — mistyped, a connection string, user info
/// without a scheme, a lone word — is never shown with its secret: not in
/// the failure of a command that could not open it (nor as the module's
/// name there), not in a usage error, from the flag or the environment.
#[actix::test]
async fn no_secret_is_shown_whatever_the_shape_of_the_url() {
    for url in [
        "amqp//guest:s3cret@h",
        "postgres//u:S3cret@h/db",
        "postgres:/u:S3cret@h",
        "host=h password=S3cret",
        "u:S3cret@h",
        "S3cret",
        "mysql://u:S3cret@h",
    ] {
        let given = |command: &str| {
            let mut given = vec!["--database-url".to_string(), url.to_string()];
            given.extend(args(command));
            given
        };
        for run in [
            run_cli(given("status")).await,
            run_cli(given("dead-letters list")).await,
            run_cli(given("dead-letters show not-an-id orders.ping")).await,
            crate::support::run_cli_with_env(args("status"), Some(url.into())).await,
        ] {
            assert_ne!(run.code, 0, "{url}: {run:#?}");
            let shown = format!("{}{}", run.stdout, run.stderr).to_lowercase();
            assert!(!shown.contains("s3cret"), "{url}: {run:#?}");
        }
    }
}
