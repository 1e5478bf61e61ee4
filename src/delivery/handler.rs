//! Handlers: named module code subscribed to one message type.

use crate::delivery::effect;
use crate::effects::policy::EffectPolicy;
use crate::message::{Envelope, Message};
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use crate::tx::Tx;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// Module code that processes one message type.
///
/// Each delivery runs [`Handler::handle`] inside a transaction on the
/// module's database that already holds the inbox row for
/// `(message id, handler name)`: the handler's changes and the inbox row
/// commit together or not at all, and a message that arrives again finds the
/// row and is skipped before the handler runs. Returning an error (or
/// panicking) rolls everything back, and the delivery is retried later.
///
/// `delivery` says which message this is (its envelope: id, correlation and
/// causation ids), to which handler, on which attempt, and gives the
/// idempotency key to pass to external systems.
///
/// Write the method as an `async fn`:
///
/// ```
/// use diesel_async::RunQueryDsl;
/// use serde::{Deserialize, Serialize};
/// use tickbox::{Delivery, Handler, HandlerError, Message, Sqlite, Tx};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderPlaced { order_id: String }
/// impl Message for OrderPlaced { const TOPIC: &'static str = "orders.order_placed"; }
///
/// struct ReserveStock;
///
/// impl Handler<Sqlite> for ReserveStock {
///     type Message = OrderPlaced;
///
///     async fn handle(
///         &self,
///         tx: &mut Tx<Sqlite>,
///         order: OrderPlaced,
///         delivery: &Delivery,
///     ) -> Result<(), HandlerError> {
///         tracing::debug!(message_id = %delivery.envelope.id, "reserving stock");
///         diesel::sql_query("INSERT INTO reservations (order_id) VALUES (?)")
///             .bind::<diesel::sql_types::Text, _>(order.order_id)
///             .execute(tx.conn())
///             .await?;
///         Ok(())
///     }
/// }
/// ```
pub trait Handler<B: Backend>: Send + Sync + 'static {
    /// The message type this handler subscribes to.
    type Message: Message;

    /// Processes one message inside the delivery's transaction.
    fn handle(
        &self,
        tx: &mut Tx<B>,
        message: Self::Message,
        delivery: &Delivery,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// How a module runs one of its handlers; see
/// [`ModuleBuilder::handler_with`](crate::ModuleBuilder::handler_with).
///
/// ```
/// use std::time::Duration;
/// use tickbox::{HandlerOptions, RetryPolicy};
///
/// let options = HandlerOptions::new()
///     .retry(RetryPolicy { max_attempts: Some(3), ..RetryPolicy::default() })
///     .batch(64);
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct HandlerOptions {
    pub(crate) retry: Option<RetryPolicy>,
    pub(crate) max_batch: usize,
    pub(crate) deadline: Option<Duration>,
}

impl Default for HandlerOptions {
    fn default() -> Self {
        HandlerOptions {
            retry: None,
            max_batch: 1,
            deadline: None,
        }
    }
}

impl HandlerOptions {
    /// The defaults: the bus's retry policy, one message per transaction.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long one delivery to this handler may take, from BEGIN to COMMIT
    /// (default: the module's
    /// [transaction deadline](crate::ModuleBuilder::transaction_deadline),
    /// 30 s). Raise it for a handler whose own work is long; a delivery
    /// past it is rolled back, its connection closed, and it is tried
    /// again later like any transient failure. A batch takes the deadline
    /// of its handler too.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Retries this handler's failures with `policy` instead of the bus's.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Handles up to `max_messages` waiting messages in one transaction:
    /// their inbox rows and the handler's changes for each of them commit
    /// together, in one COMMIT instead of one per message. 1 (the default)
    /// turns batching off.
    ///
    /// Batches form only from deliveries already waiting when a transaction
    /// starts, so a lone message is never held back to fill one. When any
    /// message of a batch fails (an error, a panic, a payload that does not
    /// decode) or the COMMIT fails, the whole batch rolls back and its
    /// messages are handled again one per transaction, so a failure affects
    /// only its own message; retries always run alone. The handler is the
    /// same code either way, but it must not assume that its transaction
    /// holds only its own message's changes.
    pub fn batch(mut self, max_messages: usize) -> Self {
        self.max_batch = max_messages;
        self
    }
}

/// Why a handler did not process a message.
///
/// Any error type converts into it with `?`. By default a failure is
/// transient: the delivery is rolled back and retried with backoff.
/// [`HandlerError::permanent`] marks a failure that no retry can fix.
pub struct HandlerError {
    error: Box<dyn std::error::Error + Send + Sync + 'static>,
    permanent: bool,
}

impl HandlerError {
    /// A transient failure with a message.
    pub fn msg(message: impl fmt::Display) -> Self {
        HandlerError {
            error: message.to_string().into(),
            permanent: false,
        }
    }

    /// A failure that retrying cannot fix (a message the handler can never
    /// accept).
    pub fn permanent(error: impl Into<HandlerError>) -> Self {
        HandlerError {
            permanent: true,
            ..error.into()
        }
    }

    /// True when retrying cannot help.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// True when the handler failed because the database did (a lost
    /// connection, a serialization failure, a busy database): retried
    /// without using up an attempt.
    pub(crate) fn is_transient_database(&self) -> bool {
        if let Some(e) = self.error.downcast_ref::<diesel::result::Error>() {
            return crate::transient::is_transient(e);
        }
        self.error
            .downcast_ref::<crate::error::Error>()
            .is_some_and(crate::error::Error::is_transient)
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError {
            error: Box::new(error),
            permanent: false,
        }
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("error", &self.error)
            .field("permanent", &self.permanent)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&crate::error::Chain(&*self.error), f)
    }
}

/// One delivery of a message to a handler, as the handler receives it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message being handled.
    pub envelope: Arc<Envelope>,
    /// The handler's name (the other half of the inbox key).
    pub handler: Arc<str>,
    /// 1 for the first delivery to this handler, then 2, 3… on retries.
    pub attempt: u32,
    /// The module's effects journal, and the effect names this delivery
    /// has used ([`Delivery::effect`]).
    pub(crate) effects: Arc<crate::effects::scope::EffectScope>,
}

impl Delivery {
    /// A key that is the same every time this message is delivered to this
    /// handler, and different for any other pair. Pass it to external systems
    /// that accept an idempotency key (payment APIs, mail services): an
    /// external call is not part of the database transaction, so a crash after
    /// the call and before COMMIT repeats it, and only such a key makes the
    /// repeat harmless.
    ///
    /// For an external call made through the effects journal, use the key
    /// [`Delivery::effect`] gives its call instead: it is per effect, and
    /// the journal keeps what the call returned.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.envelope.id, self.handler)
    }

    /// The ordering key the message was published with, if any
    /// ([`Tx::publish_keyed`](crate::Tx::publish_keyed)).
    pub fn ordering_key(&self) -> Option<&str> {
        self.envelope.keyed.as_ref().map(|k| k.key.as_str())
    }

    /// The message's number in its key's order (1, 2, 3… per topic and key
    /// of the publishing module; see [`Keyed`](crate::Keyed)), if it has a
    /// key. The handler has seen every earlier number of the key, except
    /// those dead-lettered and skipped by an operator; a handler keeping a
    /// copy can also store it and drop anything older.
    pub fn sequence(&self) -> Option<i64> {
        self.envelope.keyed.as_ref().map(|k| k.sequence)
    }

    /// Makes an external call (an e-mail, a payment, an HTTP request)
    /// through the module's effects journal, so that a redelivered message
    /// does not repeat it blindly.
    ///
    /// The database work of a handler is effectively once thanks to the
    /// inbox, but an external call is not part of the transaction: a crash
    /// after the call and before COMMIT would repeat it. Here the journal
    /// records the effect as started (committed in a short transaction of
    /// its own, before the call), then as succeeded with the call's result,
    /// or failed. A later delivery of the same message then:
    ///
    /// - finds it **succeeded**: gets the recorded result back, and `call`
    ///   is not run — even when the handler's own transaction never
    ///   committed;
    /// - finds it **started** without an outcome (a crash cut it short):
    ///   does what `policy` says ([`EffectPolicy`]): call again with the
    ///   same key, or refuse;
    /// - finds it **failed**: calls again (within the key's window, for
    ///   [`EffectPolicy::AtLeastOnceWithKey`]).
    ///
    /// `call` receives the effect's idempotency key: the same for every
    /// delivery of this message to this handler and this effect name, in
    /// every process, and different for any other. Pass it to the external
    /// system wherever it takes one (an `Idempotency-Key` header, an
    /// e-mail's `Message-ID`, a payment's key).
    ///
    /// `name` names the effect within the handler, like a handler's name
    /// within its module: keep it stable across releases. Each effect of one
    /// delivery needs its own name; using a name twice in one delivery is a
    /// permanent error.
    ///
    /// Errors: `call`'s error, recorded as failed, keeps its permanence
    /// (the handler's retry policy decides what follows). A refused call
    /// (an effect nobody can vouch for: [`EffectState::Unknown`](crate::EffectState::Unknown)) is a
    /// permanent error, so the delivery is dead-lettered with the reason;
    /// a person settles the effect
    /// ([`ModuleHandle::settle_effect`](crate::ModuleHandle::settle_effect),
    /// or the operator's tool) and replays the dead letter. A journal that
    /// cannot be written before the call is a transient error, and `call`
    /// is not run; one that cannot be written after it is a transient error
    /// too, though the call happened: the entry stays started, and the next
    /// delivery does what `policy` says of an effect cut short.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use serde::{Deserialize, Serialize};
    /// use tickbox::{Delivery, EffectPolicy, Handler, HandlerError, Message, Sqlite, Tx};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct OrderConfirmed { order_id: i64, email: String }
    /// impl Message for OrderConfirmed { const TOPIC: &'static str = "orders.order_confirmed"; }
    ///
    /// # async fn send_mail(_to: &str, _message_id: &str) -> Result<String, std::io::Error> { Ok("250 OK".into()) }
    /// struct SendConfirmation;
    ///
    /// impl Handler<Sqlite> for SendConfirmation {
    ///     type Message = OrderConfirmed;
    ///
    ///     async fn handle(
    ///         &self,
    ///         _tx: &mut Tx<Sqlite>,
    ///         order: OrderConfirmed,
    ///         delivery: &Delivery,
    ///     ) -> Result<(), HandlerError> {
    ///         // The mail server folds equal Message-IDs for a day.
    ///         let policy = EffectPolicy::at_least_once_with_key(Duration::from_secs(24 * 3600));
    ///         let reply: String = delivery
    ///             .effect("send_confirmation", policy, |key: String| async move {
    ///                 send_mail(&order.email, &format!("<{key}@shop.example>")).await
    ///             })
    ///             .await?;
    ///         tracing::info!(%reply, order_id = order.order_id, "confirmation sent");
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub async fn effect<T, E, F, Fut>(
        &self,
        name: &str,
        policy: EffectPolicy,
        call: F,
    ) -> Result<T, HandlerError>
    where
        T: Serialize + DeserializeOwned + Send,
        E: Into<HandlerError>,
        F: FnOnce(String) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        #[cfg(feature = "opentelemetry")]
        let span = crate::trace::spans::effect(name, policy.name());
        let run = effect::run(self, name, policy, call);
        #[cfg(feature = "opentelemetry")]
        let run = tracing::Instrument::instrument(run, span);
        run.await
    }
}

/// Why an erased handler call failed.
pub(crate) enum CallError {
    /// The payload does not decode into the handler's message type.
    Undecodable(String),
    /// The handler returned an error.
    Handler(HandlerError),
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A handler with its message type erased, as a module stores it.
pub(crate) trait ErasedHandler<B: Backend>: Send + Sync {
    /// The topic of the handler's message type.
    fn topic(&self) -> &'static str;

    /// Decodes the payload of `delivery` and runs the handler.
    fn call<'a>(
        &'a self,
        tx: &'a mut Tx<B>,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), CallError>>;
}

/// Wraps a typed handler to store it beside handlers of other types.
pub(crate) struct Typed<H>(pub(crate) H);

impl<B: Backend, H: Handler<B>> ErasedHandler<B> for Typed<H> {
    fn topic(&self) -> &'static str {
        H::Message::TOPIC
    }

    fn call<'a>(
        &'a self,
        tx: &'a mut Tx<B>,
        delivery: &'a Delivery,
    ) -> BoxFuture<'a, Result<(), CallError>> {
        Box::pin(async move {
            let message = serde_json::from_str::<H::Message>(&delivery.envelope.payload)
                .map_err(|e| CallError::Undecodable(e.to_string()))?;
            self.0
                .handle(tx, message, delivery)
                .await
                .map_err(CallError::Handler)
        })
    }
}
