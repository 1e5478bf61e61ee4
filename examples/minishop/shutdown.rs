//! Ctrl-C: the first asks the run to stop, through a `CancellationToken`
//! that the placing and waiting loops watch; the second quits at once, and
//! so does a stop that takes longer than [`STOP_DEADLINE`].

use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How long the run may take to stop after the first Ctrl-C, even with
/// every connection dead: the bus's stop timeout (30 s, which bounds
/// `BusHandle::stop`) and a little for the report. Past it the process
/// quits like a second Ctrl-C: as safe as a crash, and `--resume` finishes
/// the work.
pub const STOP_DEADLINE: Duration = Duration::from_secs(40);

/// A token cancelled by the first Ctrl-C (SIGINT) or SIGTERM: no more
/// orders, no more retried statements, the bus stops (running deliveries
/// finish, the rest stays pending). The second quits at once with exit
/// code 130, which is as safe as a crash.
pub fn on_ctrl_c() -> CancellationToken {
    let stop = CancellationToken::new();
    actix::spawn(stop_on_signal(stop.clone()));
    stop
}

async fn stop_on_signal(stop: CancellationToken) {
    if !signal().await {
        return;
    }
    stop.cancel();
    crate::faults::stop_retrying();
    crate::progress::say(
        "minishop: interrupted — placing no more orders and stopping the bus \
         (running deliveries finish, the rest stays pending); Ctrl-C again quits at once",
    );
    tokio::select! {
        true = signal() => crate::progress::say(
            "minishop: interrupted again — quitting now; --resume finishes the work",
        ),
        () = tokio::time::sleep(STOP_DEADLINE) => crate::progress::say(&format!(
            "minishop: stopping took longer than {STOP_DEADLINE:?} — quitting now; --resume finishes the work",
        )),
    }
    std::process::exit(130);
}

/// Ctrl-C or, on Unix, SIGTERM (how service managers ask a process to
/// stop); false if neither can be listened for.
async fn signal() -> bool {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            return tokio::select! {
                interrupted = tokio::signal::ctrl_c() => interrupted.is_ok(),
                terminated = terminate.recv() => terminated.is_some(),
            };
        }
    }
    tokio::signal::ctrl_c().await.is_ok()
}
