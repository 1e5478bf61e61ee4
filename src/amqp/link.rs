//! One connection to the broker, whose socket is released whenever it is
//! given up; and the deadline every call to the broker runs under.
//!
//! lapin runs each connection's I/O on a thread of its own, which holds the
//! socket until the connection ends *as lapin sees it*. Two ways a
//! connection never ends that way: an attempt dropped in the middle of its
//! handshake (lapin waits for the broker's answer for ever, and its
//! heartbeat only starts once connected), and a connection whose close the
//! broker never answers (lapin stops its heartbeat as soon as it starts
//! closing). Behind a network that has gone silent both are common, and
//! each kept a socket and a thread for the life of the process. So tickbox
//! opens the TCP connection itself, keeps a second handle on its socket,
//! and a [`Link`] that is given up (dropped) shuts that socket down: lapin's
//! thread reads the end of the stream, ends, and the socket is released,
//! whatever state the connection was in.
//!
//! Every call to the broker runs under a deadline ([`Caller::within`]): a
//! call without an answer in time gives up its connection, and is logged
//! once and counted (`tickbox_amqp_calls_timed_out_total{role}`,
//! [`BrokerMetrics::calls_timed_out`](crate::BrokerMetrics::calls_timed_out)).

use crate::amqp::fault::Fault;
use crate::amqp::settings::Amqp;
use futures_util::StreamExt;
use lapin::tcp::{AMQPUriTcpExt, AsyncTcpStream};
use lapin::{Channel, Connection, ConnectionProperties, Event};
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long closing a channel, then its connection, may take before the
/// socket is shut regardless: a broker that blocks publishers reads
/// nothing more, not even a close, and a silent network answers nothing.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Who makes calls to the broker: named when one of its calls misses its
/// deadline, and counted.
pub(crate) struct Caller {
    /// For the log: `the relay`, `the consumer of <module>/<handler>`.
    who: String,
    /// For the exported counter: `relay`, `consumer` or `topology`.
    role: &'static str,
    /// Its calls that missed their deadline, for the bus's figures.
    timed_out: Arc<AtomicU64>,
}

impl Caller {
    /// A caller whose missed deadlines add to `timed_out`.
    pub(crate) fn new(who: String, role: &'static str, timed_out: Arc<AtomicU64>) -> Arc<Self> {
        Arc::new(Caller {
            who,
            role,
            timed_out,
        })
    }

    /// Runs `call` (which is `doing` something) for at most `limit`. A call
    /// without an answer by then is logged, counted and reported as
    /// [`Fault::TimedOut`]: its connection is to be given up. One timer per
    /// call; a call that covers many messages (a flush of acks) pays one.
    pub(crate) async fn within<T>(
        &self,
        limit: Duration,
        doing: impl Display,
        call: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, Fault> {
        match tokio::time::timeout(limit, call).await {
            Ok(done) => done.map_err(|error| Fault::of(&doing, &error)),
            Err(_) => {
                self.timed_out.fetch_add(1, Relaxed);
                metrics::counter!("tickbox_amqp_calls_timed_out_total", "role" => self.role)
                    .increment(1);
                tracing::warn!(
                    who = %self.who,
                    operation = %doing,
                    waited = ?limit,
                    "no answer from the broker in time: giving up the connection"
                );
                Err(Fault::TimedOut(format!(
                    "{doing}: no answer from the broker within {limit:?}"
                )))
            }
        }
    }
}

/// A connection to the broker. Dropping it shuts its socket, so a link
/// given up in any state releases its socket; [`close`](Link::close) says
/// goodbye to the broker first, [`give_up`](Link::give_up) only if the
/// broker still answers.
pub(crate) struct Link {
    /// The connection.
    connection: Connection,
    /// Who uses it.
    caller: Arc<Caller>,
    /// How long each call on it may take.
    call_deadline: Duration,
    /// Its socket, shut when the link is closed, given up or dropped.
    socket: ShutOnDrop,
    /// Dropped with the link: ends the task that shuts the socket when
    /// lapin reports the connection failed.
    _watching: oneshot::Sender<()>,
}

/// The TLS handshake an `amqps://` URL asks for, over the TCP connection
/// tickbox opened; nothing for `amqp://`.
struct Handshake {
    /// rustls, configured as the URL asks; `None` in clear.
    #[cfg(feature = "tls")]
    connector: Option<(lapin::tcp::RustlsConnector, crate::tls::TlsSettings)>,
    /// Why the handshake failed, in plain words, if it did.
    failure: Arc<Mutex<Option<String>>>,
}

impl Handshake {
    /// The handshake `amqp`'s URL asks for.
    fn new(amqp: &Amqp) -> Result<Handshake, Fault> {
        let settings = amqp
            .tls()
            .map_err(|error| Fault::Refused(format!("connecting: {error}")))?;
        #[cfg(feature = "tls")]
        let connector = match settings {
            Some(settings) => {
                let config = crate::tls::client_config(&settings)
                    .map_err(|error| Fault::Refused(format!("connecting: {error}")))?;
                Some((lapin::tcp::RustlsConnector::from(config), settings))
            }
            None => None,
        };
        #[cfg(not(feature = "tls"))]
        drop(settings);
        Ok(Handshake {
            #[cfg(feature = "tls")]
            connector,
            failure: Arc::default(),
        })
    }

    /// Whether the connection is to be encrypted.
    fn encrypts(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.connector.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// `stream`, encrypted if the URL asks, within `limit`.
    async fn over<S>(
        &self,
        stream: AsyncTcpStream<S>,
        host: &str,
        limit: Duration,
    ) -> io::Result<AsyncTcpStream<S>>
    where
        S: futures_util::AsyncRead + futures_util::AsyncWrite + Send + Unpin + 'static,
    {
        #[cfg(feature = "tls")]
        if let Some((connector, settings)) = &self.connector {
            let handshake = stream.into_rustls(connector, host);
            let encrypted = tokio::time::timeout(limit, handshake).await.map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no TLS handshake within {limit:?}"),
                )
            })?;
            return encrypted.map_err(|error| {
                match crate::tls::explain_handshake_failure(&error, settings) {
                    Some(reason) => {
                        if let Ok(mut failure) = self.failure.lock() {
                            *failure = Some(reason.clone());
                        }
                        io::Error::new(io::ErrorKind::InvalidData, reason)
                    }
                    None => error,
                }
            });
        }
        let _ = (host, limit);
        Ok(stream)
    }
}

impl Link {
    /// Connects to the broker as `name` (shown by the broker), within the
    /// call timeout, asking for the heartbeat of `amqp`.
    pub(crate) async fn open(amqp: &Amqp, name: &str, caller: Arc<Caller>) -> Result<Link, Fault> {
        let uri = amqp
            .uri()
            .map_err(|error| Fault::Refused(format!("connecting: {error}")))?;
        let runtime =
            lapin::runtime::default_runtime().map_err(|error| Fault::of("connecting", &error))?;
        let properties = ConnectionProperties::default().with_connection_name(name.into());
        // Shut if the attempt is given up, whether TCP has connected by
        // then or not.
        let socket = ShutOnDrop(Socket::default());
        let keep = socket.0.clone();
        let limit = amqp.call_deadline;
        let tls = Handshake::new(amqp)?;
        let failed_handshake = tls.failure.clone();
        let encrypted = if tls.encrypts() { 1.0 } else { 0.0 };
        let connecting = Connection::connector(
            uri,
            runtime,
            async move |uri, runtime| {
                // TCP first, in clear, so that its socket can be kept;
                // then TLS over it when the URL is amqps://.
                let mut plain = uri.clone();
                plain.scheme = lapin::uri::AMQPScheme::AMQP;
                let stream = tokio::time::timeout(limit, plain.connect_async(&runtime))
                    .await
                    .map_err(|_| {
                        io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("no TCP connection within {limit:?}"),
                        )
                    })??;
                if let AsyncTcpStream::Plain(tcp) = &stream {
                    keep.keep(duplicate(tcp.get_ref())?)?;
                }
                Ok(tls.over(stream, &uri.authority.host, limit).await?)
            },
            properties,
        );
        let connection = match caller.within(limit, "connecting", connecting).await {
            Ok(connection) => connection,
            // A refused certificate is not fixed by trying again.
            Err(fault) => match failed_handshake.lock().map(|mut f| f.take()) {
                Ok(Some(reason)) => return Err(Fault::Refused(format!("connecting: {reason}"))),
                _ => return Err(fault),
            },
        };
        metrics::gauge!("tickbox_connection_encrypted", "connection" => name.to_owned(), "server" => "amqp")
            .set(encrypted);
        let (watching, dropped) = oneshot::channel();
        tokio::spawn(shut_when_failed(
            connection.events_listener(),
            socket.0.clone(),
            dropped,
        ));
        Ok(Link {
            connection,
            caller,
            call_deadline: limit,
            socket,
            _watching: watching,
        })
    }

    /// Runs `call` on this link within the call timeout.
    pub(crate) async fn call<T>(
        &self,
        doing: impl Display,
        call: impl Future<Output = lapin::Result<T>>,
    ) -> Result<T, Fault> {
        self.caller.within(self.call_deadline, doing, call).await
    }

    /// Opens a channel.
    pub(crate) async fn channel(&self) -> Result<Channel, Fault> {
        self.call("opening a channel", self.connection.create_channel())
            .await
    }

    /// Gives the link up after `fault`: closes `channel` and the connection
    /// politely, unless the fault was a missed deadline (the broker is not
    /// answering: the socket is shut at once).
    pub(crate) async fn give_up(&self, channel: Option<Channel>, fault: &Fault, why: &'static str) {
        if let Fault::TimedOut(_) = fault {
            self.shut();
        } else {
            self.close(channel, why).await;
        }
    }

    /// Closes `channel` (if any), then the connection, each within
    /// [`CLOSE_TIMEOUT`]; then shuts the socket, however the broker
    /// answered. The channel goes first: lapin closes a dropped channel by
    /// itself, and if its connection is closing by then, it reports a
    /// connection error.
    pub(crate) async fn close(&self, channel: Option<Channel>, why: &'static str) {
        if let Some(channel) = channel.filter(|channel| channel.status().connected()) {
            let _ = tokio::time::timeout(CLOSE_TIMEOUT, channel.close(200, why.into())).await;
        }
        if self.connection.status().connected() {
            let _ =
                tokio::time::timeout(CLOSE_TIMEOUT, self.connection.close(200, why.into())).await;
        }
        self.shut();
    }

    /// Shuts the socket now, without a word to the broker: calls under way
    /// on the link fail, and lapin's thread ends.
    pub(crate) fn shut(&self) {
        self.socket.0.shut();
    }
}

/// Shuts `socket` once lapin reports its connection failed (a missed
/// heartbeat, the broker closing it, a broken socket), so that a link
/// nobody uses for a while does not hold a dead socket; ends when the link
/// drops.
async fn shut_when_failed(
    events: impl futures_util::Stream<Item = Event>,
    socket: Socket,
    dropped: oneshot::Receiver<()>,
) {
    let failed = async {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.next().await {
            if let Event::Error(_) = event {
                return true;
            }
        }
        false
    };
    tokio::select! {
        _ = dropped => {}
        failed = failed => if failed {
            socket.shut();
        },
    }
}

/// A second handle on a connection's TCP socket, to shut it from outside
/// lapin.
#[derive(Clone, Default)]
struct Socket(Arc<Mutex<SocketSlot>>);

/// What a [`Socket`] holds.
#[derive(Default)]
struct SocketSlot {
    /// A duplicate of the socket's descriptor, from the moment TCP
    /// connects until the socket is shut.
    duplicate: Option<TcpStream>,
    /// Shut already: a socket that connects later is refused.
    shut: bool,
}

impl Socket {
    /// Keeps `duplicate`, a second descriptor of the connection's socket;
    /// refused if the connection was given up while TCP was connecting.
    fn keep(&self, duplicate: TcpStream) -> io::Result<()> {
        let mut slot = self.lock();
        if slot.shut {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "the connection attempt was given up",
            ));
        }
        slot.duplicate = Some(duplicate);
        Ok(())
    }

    /// Shuts the socket both ways and lets go of the duplicate: lapin's
    /// thread reads the end of the stream, ends, and closes the last
    /// descriptor.
    fn shut(&self) {
        let mut slot = self.lock();
        slot.shut = true;
        if let Some(duplicate) = slot.duplicate.take() {
            // Already shut by the broker, or never connected: nothing to do.
            let _ = duplicate.shutdown(Shutdown::Both);
        }
    }

    fn lock(&self) -> MutexGuard<'_, SocketSlot> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A second descriptor of `tcp`'s socket.
#[cfg(unix)]
fn duplicate(tcp: &impl std::os::fd::AsFd) -> io::Result<TcpStream> {
    Ok(TcpStream::from(tcp.as_fd().try_clone_to_owned()?))
}

/// A second handle of `tcp`'s socket.
#[cfg(windows)]
fn duplicate(tcp: &impl std::os::windows::io::AsSocket) -> io::Result<TcpStream> {
    Ok(TcpStream::from(tcp.as_socket().try_clone_to_owned()?))
}

/// Shuts its socket when dropped.
struct ShutOnDrop(Socket);

impl Drop for ShutOnDrop {
    fn drop(&mut self) {
        self.0.shut();
    }
}
