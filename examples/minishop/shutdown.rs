//! Ctrl-C: the first asks the run to stop, through a `CancellationToken`
//! that the placing and waiting loops watch; the second quits at once.

use tokio_util::sync::CancellationToken;

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
    if signal().await {
        crate::progress::say(
            "minishop: interrupted again — quitting now; --resume finishes the work",
        );
        std::process::exit(130);
    }
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
