//! Ctrl-C: the first asks the run to stop, the second quits at once.

use tokio_util::sync::CancellationToken;

/// A token cancelled by the first Ctrl-C: no more changes, no more retried
/// statements, the bus stops (running deliveries finish, the rest stays
/// pending for `--resume`). A second Ctrl-C quits at once with exit code
/// 130, which is as safe as a crash.
pub fn on_ctrl_c() -> CancellationToken {
    let stop = CancellationToken::new();
    let cancel = stop.clone();
    actix::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        cancel.cancel();
        crate::faults::stop_retrying();
        eprintln!("catalog: interrupted — stopping; Ctrl-C again quits at once");
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("catalog: quitting now; --resume finishes the work");
            std::process::exit(130);
        }
    });
    stop
}
