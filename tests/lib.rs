//! Integration tests: one suite, run against every backend.
//!
//! SQLite always runs. The PostgreSQL suite, and the PostgreSQL-only tests of
//! LISTEN/NOTIFY wake-ups (`postgres_wakeup`), run with the `postgres`
//! feature and need `TICKBOX_PG_URL`:
//!
//! ```text
//! TICKBOX_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test --all-features
//! ```
//!
//! The MariaDB/MySQL suite runs with the `mysql` feature and needs
//! `TICKBOX_MYSQL_URL`, the server's URL without a database (each module
//! gets a database of its own):
//!
//! ```text
//! TICKBOX_MYSQL_URL=mysql://root@127.0.0.1:3306 cargo test --all-features
//! ```
//!
//! `deadlines` cuts transactions and deliveries that get no answer, and
//! refuses deadlines too short to be safe.
//!
//! `errors`: a database that cannot be opened says why, a refused broker
//! login is tickbox's one error, and no URL's secret is shown, whatever
//! its shape, by the library or the examples' command lines.
//!
//! The process tests run the minishop example as a child process:
//! `processes` (crashes, several processes, a broker's faults),
//! `effects_mail` (real e-mails), `quiet_network` (a network that goes
//! quiet, through the fault proxy in `support::fault_proxy`).
//!
//! `tls` (feature `tls`) runs delivery cases over encrypted, verified
//! connections to PostgreSQL and RabbitMQ; `.ci/tls` makes the CA and certificates it needs
//! and has the servers present them.

#[cfg(feature = "amqp")]
mod amqp;
mod deadlines;
mod effects_mail;
mod errors;
mod examples;
#[cfg(feature = "prometheus")]
mod exposition;
#[cfg(feature = "postgres")]
mod postgres_wakeup;
mod processes;
#[cfg(feature = "postgres")]
mod quiet_network;
mod safeguards;
mod suite;
mod support;
#[cfg(feature = "tls")]
mod tls;

/// Instantiates the suite's delivery tests for one backend over the
/// RabbitMQ transport: the same tests, with every bus running over the
/// broker.
#[cfg(feature = "amqp")]
macro_rules! amqp_suite {
    ($backend:ty, $db:expr) => {
        macro_rules! case {
            ($name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$name::<$backend>($db.over_amqp()).await;
                }
            };
            ($area:ident :: $name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$area::$name::<$backend>($db.over_amqp()).await;
                }
            };
        }

        case!(rolled_back_publish_is_never_delivered_and_committed_one_is);
        case!(a_redelivered_message_is_skipped_and_counted);
        case!(a_handler_error_rolls_back_and_is_retried);
        case!(a_handler_panic_rolls_back_and_is_retried);
        case!(each_handler_ticks_its_own_inbox_row);
        case!(a_message_published_by_a_handler_exists_only_if_it_commits);
        case!(batches::waiting_messages_commit_together_in_batches_and_each_once);
        case!(batches::a_failing_message_rolls_back_its_batch_and_only_it_is_dead_lettered);
        case!(faults::a_poison_message_is_dead_lettered_while_others_flow_and_replayed_once);
        case!(faults::a_permanent_error_dead_letters_at_once_and_can_be_discarded);
        case!(faults::stopping_with_deliveries_in_flight_loses_and_doubles_nothing);
        case!(ordering::interleaved_keys_arrive_in_order_through_failures_panics_and_duplicates);
        case!(ordering::a_poison_message_parks_only_its_key_and_replaying_it_restores_the_order);
        case!(ordering::order_holds_across_a_restart);
        case!(ordering::two_processes_sharing_the_outbox_keep_each_keys_order);
        case!(ordering::a_batched_handler_receives_each_key_in_order);
        case!(effects::an_at_most_once_effect_cut_short_becomes_unknown_and_is_dead_lettered);
        case!(effects::a_batch_that_falls_back_calls_no_effect_twice);
        case!(kit::a_flow_whose_last_message_follows_a_retry_is_not_finished_early);
        case!(kit::injected_failures_and_duplicates_change_nothing_in_the_end);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::one_flow_is_one_trace_from_the_publisher_through_every_handler);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::a_dead_letter_keeps_its_trace);
        case!(scheduled::a_scheduled_message_is_delivered_when_due_never_before);
        case!(scheduled::a_scheduled_keyed_message_takes_its_place_in_its_key_when_due);
    };
}

/// Instantiates every suite test for one backend: `case!(area::test)` runs
/// `crate::suite::area::test::<Backend>` as an actix test.
macro_rules! suite {
    ($backend:ty, $db:expr) => {
        macro_rules! case {
            ($name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$name::<$backend>($db).await;
                }
            };
            ($area:ident :: $name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$area::$name::<$backend>($db).await;
                }
            };
        }

        case!(rolled_back_publish_is_never_delivered_and_committed_one_is);
        case!(a_redelivered_message_is_skipped_and_counted);
        case!(concurrent_deliveries_of_one_message_commit_once);
        case!(a_handler_error_rolls_back_and_is_retried);
        case!(a_handler_panic_rolls_back_and_is_retried);
        case!(each_handler_ticks_its_own_inbox_row);
        case!(a_message_published_by_a_handler_exists_only_if_it_commits);
        case!(a_crash_between_handler_commit_and_outbox_mark_redelivers_without_applying_twice);
        case!(configuration_mistakes_fail_at_start_with_clear_errors);
        case!(a_read_only_transaction_reads_without_blocking_and_cannot_publish);
        case!(the_modules_of_a_stopped_bus_join_a_new_one);

        case!(batches::waiting_messages_commit_together_in_batches_and_each_once);
        case!(batches::a_failing_message_rolls_back_its_batch_and_only_it_is_dead_lettered);

        case!(faults::a_poison_message_is_dead_lettered_while_others_flow_and_replayed_once);
        case!(faults::a_permanent_error_dead_letters_at_once_and_can_be_discarded);
        case!(faults::bad_rows_become_dead_letters_and_nothing_else_is_lost);
        case!(faults::retention_sweeps_old_rows_and_keeps_recent_duplicates_out);
        case!(faults::stopping_with_deliveries_in_flight_loses_and_doubles_nothing);
        case!(faults::a_dead_process_claims_are_taken_over_when_they_expire);
        case!(faults::a_named_instance_takes_its_own_claims_back_at_once);
        case!(faults::two_buses_on_one_set_of_databases_handle_each_message_once);
        case!(faults::an_outbox_retention_of_zero_deletes_rows_as_they_are_delivered);
        case!(faults::messages_beyond_the_announcement_queue_are_delivered_without_waiting_for_a_lease);
        case!(faults::transient_database_failures_are_told_from_permanent_ones);

        case!(generic::a_handler_written_once_runs_its_diesel_queries_on_every_backend);

        case!(hostile::hostile_rows_end_as_dead_letters_while_good_messages_flow);
        case!(hostile::a_stalled_message_is_counted_and_named);

        case!(shared_outbox::processes_with_disjoint_handlers_each_get_every_message);
        case!(shared_outbox::processes_with_overlapping_handlers_each_get_every_message);
        case!(shared_outbox::three_processes_one_only_publishing_each_get_every_message);
        case!(shared_outbox::replicas_with_identical_handlers_each_get_every_message_once);
        case!(shared_outbox::a_late_subscriber_gets_what_commits_after_it_subscribed);
        case!(shared_outbox::a_stopped_subscriber_keeps_its_messages_until_it_returns_or_is_retired);
        case!(shared_outbox::a_handler_on_another_topic_in_a_running_process_is_refused);
        case!(shared_outbox::a_database_migrated_by_a_newer_tickbox_is_refused);
        case!(shared_outbox::processes_starting_together_on_a_new_database_migrate_once);
        case!(shared_outbox::a_database_being_made_is_never_seen_half_made);
        case!(shared_outbox::a_module_runs_the_applications_own_migrations);
        case!(shared_outbox::a_migration_with_a_version_of_tickbox_on_any_backend_is_refused);

        case!(ordering::interleaved_keys_arrive_in_order_through_failures_panics_and_duplicates);
        case!(ordering::a_poison_message_parks_only_its_key_and_replaying_it_restores_the_order);
        case!(ordering::skipping_a_parked_keys_dead_letter_lets_the_key_move_on);
        case!(ordering::order_holds_across_a_restart);
        case!(ordering::two_processes_sharing_the_outbox_keep_each_keys_order);
        case!(ordering::a_batched_handler_receives_each_key_in_order);
        case!(ordering::concurrent_publishers_of_one_key_are_numbered_in_commit_order);
        case!(ordering::a_handler_that_joins_later_starts_each_key_where_it_joins);

        case!(effects::a_recorded_result_comes_back_on_redelivery_without_calling_again);
        case!(effects::an_effect_name_used_twice_in_one_delivery_is_a_clear_permanent_error);
        case!(effects::an_effect_cut_short_is_called_again_with_the_same_key_within_its_window);
        case!(effects::a_call_due_after_its_keys_window_is_refused_until_a_person_allows_it);
        case!(effects::an_at_most_once_effect_cut_short_becomes_unknown_and_is_dead_lettered);
        case!(effects::a_failed_call_follows_the_retry_policy);
        case!(effects::a_batch_that_falls_back_calls_no_effect_twice);
        case!(effects::the_retention_sweep_removes_settled_effects_but_not_a_dead_letters);

        case!(kit::a_flow_whose_last_message_follows_a_retry_is_not_finished_early);
        case!(kit::a_handler_failure_fails_the_session_with_the_error_and_the_message);
        case!(kit::the_kit_s_assertions_point_at_the_test_s_own_line);
        case!(kit::an_unfinished_flow_is_reported_with_what_it_waits_for);
        case!(kit::injected_failures_and_duplicates_change_nothing_in_the_end);
        case!(kit::a_message_delivered_straight_to_a_handler_is_tracked_with_its_cascade);

        case!(observability::a_failed_delivery_is_logged_at_warn_level_with_what_identifies_it);
        case!(observability::counters_move_exactly_as_deliveries_happen);
        case!(observability::lag_rises_while_the_bus_is_stopped_and_returns_to_zero);
        case!(observability::mailbox_depth_rises_under_a_slow_handler_and_falls_back);

        #[cfg(feature = "opentelemetry")]
        case!(trace_context::one_flow_is_one_trace_from_the_publisher_through_every_handler);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::the_context_comes_back_from_the_outbox_row_after_a_restart);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::a_duplicate_is_skipped_in_its_own_span);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::a_dead_letter_keeps_its_trace);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::a_batch_s_process_span_links_every_message_s_context);
        #[cfg(feature = "opentelemetry")]
        case!(trace_context::an_effect_is_a_span_inside_its_delivery);
        case!(scheduled::a_scheduled_message_is_delivered_when_due_never_before);
        case!(scheduled::a_cancelled_message_is_never_delivered_and_a_due_one_is_not_cancelled);
        case!(scheduled::a_scheduled_message_waits_through_a_stop_and_a_start);
        case!(scheduled::processes_sharing_the_outbox_deliver_each_scheduled_message_once);
        case!(scheduled::a_scheduled_keyed_message_takes_its_place_in_its_key_when_due);
        case!(scheduled::a_session_s_clock_tests_a_fifteen_minute_timeout_without_waiting_for_it);
    };
}

mod sqlite {
    suite!(tickbox::Sqlite, crate::support::TestDb::new());
}

#[cfg(feature = "postgres")]
mod postgres {
    suite!(tickbox::Postgres, crate::support::TestDb::postgres());
}

#[cfg(feature = "mysql")]
mod mysql {
    suite!(tickbox::Mysql, crate::support::TestDb::mysql());

    // Its DDL commits at once: a migration cut short is partly done.
    case!(shared_outbox::a_migration_cut_short_runs_again_over_its_own_work);
}

#[cfg(feature = "amqp")]
mod sqlite_amqp {
    amqp_suite!(tickbox::Sqlite, crate::support::TestDb::new());
}

#[cfg(all(feature = "amqp", feature = "postgres"))]
mod postgres_amqp {
    amqp_suite!(tickbox::Postgres, crate::support::TestDb::postgres());
}

#[cfg(all(feature = "amqp", feature = "mysql"))]
mod mysql_amqp {
    amqp_suite!(tickbox::Mysql, crate::support::TestDb::mysql());
}
