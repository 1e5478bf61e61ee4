//! The confirmation e-mail over SMTP (`--smtp`): built with lettre, sent
//! over one plain SMTP connection per e-mail, and what the effects journal
//! keeps of it.
//!
//! The handler (`SendConfirmation` in main.rs) sends it with
//! [`Mailer::send`], which makes the call through `Delivery::effect`: the
//! journal records the e-mail as started (committed at once) before the
//! call, and as succeeded, with what the call returned, after it. A later
//! delivery of the message finds it succeeded and gets [`Sent`] back
//! without sending; one that finds it started (a crash cut it short) sends
//! it again with the same key, or makes it unknown and gives the delivery
//! up (a dead letter, for a person), as `--email-policy` says. The effect
//! gives the call its idempotency key; the e-mail carries it as its
//! Message-ID, `<KEY@minishop.example>`, the same on every try, so a mail
//! server or an inbox that folds equal Message-IDs folds a repeat.
//!
//! How a failure is reported decides what the journal does next, so each
//! says whether the server may have taken the e-mail:
//!
//! - surely not (the server out of reach, or refusing with a 4xx or 5xx
//!   reply): an error, recorded as failed; the delivery is retried (a 5xx:
//!   dead-lettered, no retry can help);
//! - perhaps (the connection lost, or no reply, after the e-mail was on
//!   its way): under at-least-once-with-key an error too, since sending
//!   again with the same Message-ID is harmless; under at-most-once nobody
//!   can tell, so the handler panics and the journal keeps the e-mail as
//!   started, which the next delivery finds and turns unknown, for a
//!   person to settle (as `EffectPolicy::AtMostOnce` asks).
//!
//! `--crash-at` aborts the process at one of two points of sending (see
//! [`Crash`]); its other injected faults are in `faults.rs`, which the
//! catalog example shares.

use crate::cli::{Args, CrashPoint};
use lettre::message::header::ContentType;
use lettre::transport::smtp::client::AsyncSmtpConnection;
use lettre::transport::smtp::extension::ClientId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;
use tickbox::{Delivery, EffectPolicy, HandlerError};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, MutexGuard};
use tokio::time::timeout;

/// The effect the confirmation e-mail is, within its handler: named as
/// stably as the handler, since the journal's entries are keyed by it.
pub const SEND_CONFIRMATION_EFFECT: &str = "send_confirmation";

/// The domain of the shop's Message-IDs and of its sender address.
const DOMAIN: &str = "minishop.example";

/// The sender of every confirmation.
const FROM: &str = "MiniShop <orders@minishop.example>";

/// How long connecting, the server's greeting, and sending the e-mail may
/// each take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// What the journal keeps of an e-mail the server accepted: the effect's
/// result, handed back to a later delivery of the same message instead of
/// sending again.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Sent {
    /// The effect's idempotency key, which the `sent_emails` row keeps.
    pub key: String,
    /// The e-mail's Message-ID, made from the key.
    pub message_id: String,
    /// The server's reply to the e-mail (`250 …`).
    pub reply: String,
}

/// The mail server, and how its e-mails are sent.
pub struct Mailer {
    /// Where the e-mails go (`--smtp`).
    server: SocketAddr,
    /// What becomes of an e-mail cut short by a crash (`--email-policy`).
    policy: EffectPolicy,
    /// The injected crashes (`--crash-at`, `--crash-rate`).
    crash: Crash,
}

impl Mailer {
    /// The mailer the arguments ask for: with `--smtp`, one sending real
    /// e-mails; without, none, and nothing leaves the process.
    pub fn from_args(args: &Args) -> Option<Self> {
        args.smtp.map(|server| Mailer {
            server,
            policy: args.email_policy.effect_policy(),
            crash: Crash::new(args.crash_at, args.crash_rate),
        })
    }

    /// Sends the confirmation of `order_id` to `to` once, through the
    /// effects journal of the delivery's module (see the module's doc);
    /// the effect's idempotency key, which the `sent_emails` row keeps.
    pub async fn send(
        &self,
        delivery: &Delivery,
        to: &str,
        subject: &str,
        order_id: &str,
    ) -> Result<String, HandlerError> {
        let _alone = self.crash.one_at_a_time().await;
        let sent: Sent = delivery
            .effect(
                SEND_CONFIRMATION_EFFECT,
                self.policy,
                |key: String| async move {
                    // The key becomes the Message-ID: the same on every try.
                    let sent = self.send_email(to, subject, order_id, &key).await?;
                    // `--crash-at after-send`: the server has the e-mail, the
                    // journal does not know it yet.
                    self.crash.maybe(CrashPoint::AfterSend);
                    Ok::<_, HandlerError>(sent)
                },
            )
            .await?;
        // `--crash-at after-journal`: the journal knows, but the delivery's
        // transaction (its `sent_emails` row, its inbox row) never commits;
        // the next delivery gets `sent` back from the journal.
        self.crash.maybe(CrashPoint::AfterJournal);
        tracing::debug!(message_id = %sent.message_id, reply = %sent.reply, "e-mail accepted");
        Ok(sent.key)
    }

    /// Sends the confirmation of `order_id` to `to`, with Message-ID
    /// `<key@minishop.example>`; see the module's doc for what its errors
    /// mean.
    async fn send_email(
        &self,
        to: &str,
        subject: &str,
        order_id: &str,
        key: &str,
    ) -> Result<Sent, HandlerError> {
        let message_id = format!("<{key}@{DOMAIN}>");
        // An e-mail that cannot be built never will be: permanent.
        let bad = |e: &dyn std::fmt::Display| {
            HandlerError::permanent(HandlerError::msg(format!(
                "the confirmation of order {order_id} to {to} cannot be built: {e}"
            )))
        };
        let email = lettre::Message::builder()
            .message_id(Some(message_id.clone()))
            .from(FROM.parse().map_err(|e| bad(&e))?)
            .to(to.parse().map_err(|e| bad(&e))?)
            .subject(subject)
            .header(ContentType::TEXT_PLAIN)
            .body(format!(
                "Hello,\n\nyour order {order_id} is confirmed.\n\nMiniShop\n"
            ))
            .map_err(|e| bad(&e))?;

        // Not sent, surely, until the server has greeted us.
        let out_of_reach = |e: &dyn std::fmt::Display| {
            HandlerError::msg(format!(
                "the SMTP server {} is out of reach: {e}",
                self.server
            ))
        };
        let stream = match timeout(TIMEOUT, TcpStream::connect(self.server)).await {
            Ok(connected) => connected.map_err(|e| out_of_reach(&e))?,
            Err(_) => return Err(out_of_reach(&"no connection within the timeout")),
        };
        // lettre writes the end of an e-mail (the line with a lone `.`) in
        // a write of its own: with Nagle's algorithm that write would wait
        // for the server to acknowledge the body, which it delays (40 ms on
        // Linux), on every e-mail.
        stream.set_nodelay(true).map_err(|e| out_of_reach(&e))?;
        let hello = ClientId::Domain(DOMAIN.to_string());
        let greeted = AsyncSmtpConnection::connect_with_transport(Box::new(stream), &hello);
        let mut conn = match timeout(TIMEOUT, greeted).await {
            Ok(greeted) => greeted.map_err(|e| out_of_reach(&e))?,
            Err(_) => return Err(out_of_reach(&"no greeting within the timeout")),
        };
        let why = match timeout(TIMEOUT, conn.send(email.envelope(), &email.formatted())).await {
            Ok(Ok(reply)) => {
                // Accepted: whatever QUIT answers changes nothing.
                let _ = timeout(TIMEOUT, conn.quit()).await;
                let lines: Vec<&str> = reply.message().collect();
                return Ok(Sent {
                    key: key.to_string(),
                    message_id,
                    reply: format!("{} {}", reply.code(), lines.join(" ")),
                });
            }
            // Refused with a reply: not sent.
            Ok(Err(e)) if e.is_transient() => {
                return Err(HandlerError::msg(format!(
                    "the SMTP server {} refused the e-mail for now: {e}",
                    self.server
                )));
            }
            Ok(Err(e)) if e.is_permanent() => {
                return Err(HandlerError::permanent(HandlerError::msg(format!(
                    "the SMTP server {} refused the e-mail: {e}",
                    self.server
                ))));
            }
            // Perhaps sent.
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no reply within the timeout".to_string(),
        };
        match self.policy {
            EffectPolicy::AtLeastOnceWithKey { .. } => Err(HandlerError::msg(format!(
                "sending to the SMTP server {} broke off ({why}); it is sent again with the same \
                 Message-ID",
                self.server
            ))),
            EffectPolicy::AtMostOnce => panic!(
                "sending {message_id} to the SMTP server {} broke off ({why}): it may have been \
                 accepted, and at most once it must not be sent again; the journal keeps it \
                 started, the next delivery makes it unknown",
                self.server
            ),
        }
    }
}

/// `--crash-at`: aborts the process at one point of sending an e-mail, with
/// probability `rate` each time it passes there — a crash in the
/// application's own code, where no library can catch it.
pub struct Crash {
    /// The point, if one is armed.
    at: Option<CrashPoint>,
    rate: f64,
    /// Held around each e-mail while a point is armed: an abort then cuts
    /// exactly the e-mail it was placed after, never another one half sent
    /// beside it, so that what the mail server received tells what the
    /// crash did.
    one_at_a_time: Mutex<()>,
}

impl Crash {
    pub fn new(at: Option<CrashPoint>, rate: f64) -> Self {
        Crash {
            at,
            rate,
            one_at_a_time: Mutex::new(()),
        }
    }

    /// While a point is armed, waits until no other e-mail is being sent;
    /// the e-mail is sent while the guard lives.
    pub async fn one_at_a_time(&self) -> Option<MutexGuard<'_, ()>> {
        match self.at {
            Some(_) => Some(self.one_at_a_time.lock().await),
            None => None,
        }
    }

    /// Aborts the process, with probability `rate`, if `point` is armed:
    /// `std::process::abort`, so that nothing after it runs — no unwinding,
    /// no COMMIT, no journal record, no clean stop of the bus.
    pub fn maybe(&self, point: CrashPoint) {
        if self.at == Some(point) && fastrand::f64() < self.rate {
            let name = match point {
                CrashPoint::AfterSend => "after-send",
                CrashPoint::AfterJournal => "after-journal",
            };
            eprintln!(
                "minishop: aborting on purpose (--crash-at {name}); --resume finishes the work"
            );
            std::process::abort();
        }
    }
}
