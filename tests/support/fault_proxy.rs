//! A TCP proxy on loopback that injects network faults between the code
//! under test and a real server (PostgreSQL, RabbitMQ).
//!
//! [`FaultProxy::start`] listens on `127.0.0.1:0` and forwards every
//! connection it accepts to the upstream address; [`FaultProxy::set`]
//! switches what the network does, while it runs:
//!
//! - [`Mode::Pass`]: bytes flow both ways.
//! - [`Mode::Blackhole`]: the network goes quiet. Every open connection
//!   stays open and new ones are still accepted, but nothing is forwarded
//!   either way: the proxy reads what each side sends and drops it. Its
//!   kernel keeps the TCP connections alive (it ACKs, answers keepalives),
//!   so neither a closed socket nor TCP itself tells the code under test
//!   anything: only its own deadlines can notice. A connection accepted
//!   during a blackhole is never connected upstream (its packets would not
//!   reach the server).
//! - [`Mode::Reset`]: every open connection is closed with a RST (linger 0,
//!   then closed), and each new one is reset as soon as it is accepted.
//! - [`Mode::Latency`]: each chunk is held back that long, each way, in
//!   order.
//!
//! A blackhole is a fault the connection does not survive. Switching back
//! to `Pass` heals the network for *new* connections only: one that was
//! open during a blackhole stays silent forever, as it does after a real
//! quiet fault (a failover that moved the server's address, a NAT entry
//! that expired, a host that died without a RST) — the state of the
//! connection on the far side is gone, so nothing sent on it arrives again.
//! Closes do not cross a dead connection either: the server never hears
//! that the client closed it, nor the client that the server did.
//!
//! Dropping the proxy stops it: the accept loop and every connection's task
//! are aborted, and their sockets closed.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What the network between the client and the server does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Forward nothing, keep every connection open; connections open now
    /// stay dead after the network heals.
    Blackhole,
    /// Reset every open connection and each new one.
    Reset,
    /// Hold each chunk back this long, each way, keeping the order.
    Latency(Duration),
}

/// A running proxy; dropping it stops it.
pub struct FaultProxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// The mode, the open connections and the counts, shared with the
    /// accept loop and the connections' tasks.
    shared: Arc<Shared>,
    /// The accept loop; it owns every connection's task (in a `JoinSet`),
    /// so aborting it aborts them all.
    accepting: JoinHandle<()>,
}

/// What the proxy and its tasks share.
struct Shared {
    upstream: SocketAddr,
    /// The mode and the connections open now, under one lock: a mode change
    /// reaches every connection open at that moment, and a connection
    /// accepted at the same time sees the new mode.
    state: Mutex<State>,
    /// Connections accepted, reset ones included.
    accepted: AtomicUsize,
    /// Connections whose client side the proxy still holds.
    open: AtomicUsize,
}

struct State {
    mode: Mode,
    /// Each open connection's link; dead ones are pruned as they go.
    links: Vec<Weak<Link>>,
}

/// One connection's fate, as mode changes decide it.
struct Link {
    /// Was open during a blackhole: forwards nothing, ever again.
    dead: AtomicBool,
    /// Its client side is open (see [`FaultProxy::open`]).
    open: AtomicBool,
    /// Reset by the proxy: its task closes both sockets with a RST.
    reset: CancellationToken,
}

impl FaultProxy {
    /// Starts a proxy to `upstream` on the current tokio runtime, in
    /// [`Mode::Pass`]. Its tasks run on that runtime: from a test that
    /// blocks its thread, use a multi-thread runtime.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the fault proxy binds a port on loopback");
        let addr = listener.local_addr().expect("the proxy's address");
        let shared = Arc::new(Shared {
            upstream,
            state: Mutex::new(State {
                mode: Mode::Pass,
                links: Vec::new(),
            }),
            accepted: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
        });
        let accepting = tokio::spawn(accept(listener, shared.clone()));
        FaultProxy {
            addr,
            shared,
            accepting,
        }
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Switches the network to `mode`, for every open connection and every
    /// new one, before it returns.
    pub fn set(&self, mode: Mode) {
        let mut state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state.mode = mode;
        state.links.retain(|link| link.strong_count() > 0);
        for link in state.links.iter().filter_map(Weak::upgrade) {
            link.apply(mode);
        }
    }

    /// The mode now.
    #[allow(dead_code)]
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Connections accepted so far, reset ones included.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }

    /// Connections open now: accepted, and neither closed by their client
    /// nor reset by the proxy (whatever became of their upstream side).
    pub fn open(&self) -> usize {
        self.shared.open.load(SeqCst)
    }

    /// Of the connections open now, those a blackhole left dead: held by
    /// a client that has not noticed they will never carry a byte again.
    pub fn open_dead(&self) -> usize {
        let state = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        state
            .links
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|link| link.is_dead() && link.open.load(SeqCst))
            .count()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Shared {
    fn mode(&self) -> Mode {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).mode
    }

    /// The delay each chunk waits now.
    fn latency(&self) -> Duration {
        match self.mode() {
            Mode::Latency(delay) => delay,
            _ => Duration::ZERO,
        }
    }

    /// Registers a new connection's link under the mode now; the mode it
    /// was registered under.
    fn register(&self, link: &Arc<Link>) -> Mode {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mode = state.mode;
        link.apply(mode);
        state.links.push(Arc::downgrade(link));
        mode
    }
}

impl Link {
    fn apply(&self, mode: Mode) {
        match mode {
            Mode::Blackhole => self.dead.store(true, SeqCst),
            Mode::Reset => self.reset.cancel(),
            Mode::Pass | Mode::Latency(_) => {}
        }
    }

    fn is_dead(&self) -> bool {
        self.dead.load(SeqCst)
    }
}

/// Counts a connection as open while it lives.
struct Open(Arc<Shared>, Arc<Link>);

impl Open {
    fn new(shared: &Arc<Shared>, link: &Arc<Link>) -> Self {
        shared.open.fetch_add(1, SeqCst);
        link.open.store(true, SeqCst);
        Open(shared.clone(), link.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.1.open.store(false, SeqCst);
        self.0.open.fetch_sub(1, SeqCst);
    }
}

/// Accepts connections until the proxy is dropped; each runs in a task of
/// the `JoinSet`, which aborts them all when this future is dropped.
async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    shared.accepted.fetch_add(1, SeqCst);
                    connections.spawn(connection(client, shared.clone()));
                }
                // Out of file descriptors, say: not a hot loop.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reaps finished connections, so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Runs one connection until both sides are done, or it is reset.
async fn connection(mut client: TcpStream, shared: Arc<Shared>) {
    let link = Arc::new(Link {
        dead: AtomicBool::new(false),
        open: AtomicBool::new(false),
        reset: CancellationToken::new(),
    });
    let mode = shared.register(&link);
    if mode == Mode::Reset {
        abort(&client);
        return;
    }
    let open = Open::new(&shared, &link);
    // A connection born in a blackhole never reaches the server.
    let mut upstream = if mode == Mode::Blackhole {
        None
    } else {
        match TcpStream::connect(shared.upstream).await {
            Ok(upstream) => Some(upstream),
            Err(_) => {
                // The server refuses: so does the proxy.
                abort(&client);
                return;
            }
        }
    };
    let _ = client.set_nodelay(true);
    if let Some(upstream) = &upstream {
        let _ = upstream.set_nodelay(true);
    }
    let reset = link.reset.clone();
    {
        let (client_read, client_write) = client.split();
        let forwarding = async {
            match upstream.as_mut() {
                Some(upstream) => {
                    let (upstream_read, upstream_write) = upstream.split();
                    tokio::join!(
                        async {
                            pump(client_read, upstream_write, &link, &shared).await;
                            // The client closed its side (or the server
                            // went away under it).
                            drop(open);
                        },
                        pump(upstream_read, client_write, &link, &shared),
                    );
                }
                None => {
                    pump(client_read, tokio::io::sink(), &link, &shared).await;
                    drop(open);
                }
            }
        };
        tokio::select! {
            () = forwarding => return,
            () = reset.cancelled() => {}
        }
    }
    abort(&client);
    if let Some(upstream) = &upstream {
        abort(upstream);
    }
}

/// Sets linger 0, so that closing the socket (when it is dropped) sends a
/// RST instead of a FIN.
fn abort(stream: &TcpStream) {
    let _ = stream.set_zero_linger();
}

/// Forwards what `from` sends to `to`, each chunk held back by the latency
/// of the moment it arrived, in order; stops at the end of `from`'s stream
/// (passing the end on) or when `to` fails. Once the link is dead it only
/// reads and drops, and passes nothing on, not even the end.
async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    link: &Link,
    shared: &Shared,
) {
    let mut buf = vec![0u8; 16 * 1024];
    let mut held: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
    let mut ended = false;
    loop {
        if link.is_dead() {
            held.clear();
        }
        if ended && held.is_empty() {
            if !link.is_dead() {
                let _ = to.shutdown().await;
            }
            return;
        }
        let due = held.front().map(|(due, _)| *due);
        tokio::select! {
            read = from.read(&mut buf), if !ended => match read {
                Ok(0) | Err(_) => ended = true,
                Ok(n) if !link.is_dead() => {
                    held.push_back((Instant::now() + shared.latency(), buf[..n].to_vec()));
                }
                Ok(_) => {}
            },
            () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                let (_, chunk) = held.pop_front().expect("a chunk is due");
                if !link.is_dead() && to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The proxy in front of an echo server on loopback.
mod tests {
    use super::{FaultProxy, Mode};
    use std::io::ErrorKind;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::time::{timeout, Instant};

    /// How long a reply that should come may take.
    const REPLY: Duration = Duration::from_secs(5);

    /// How long a connection must stay silent to count as forwarding
    /// nothing: on loopback an echo comes back within a millisecond.
    const SILENCE: Duration = Duration::from_millis(500);

    /// An echo server: sends back every byte it receives; counts the
    /// connections it accepted. Stops with the test's runtime.
    async fn echo_server() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let counted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counted.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    let (mut read, mut write) = socket.split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        (addr, accepted)
    }

    async fn connect(proxy: &FaultProxy) -> TcpStream {
        TcpStream::connect(proxy.addr())
            .await
            .expect("the proxy accepts")
    }

    /// Sends `text` and reads the echo, within `REPLY`.
    async fn round_trip(stream: &mut TcpStream, text: &[u8]) {
        stream.write_all(text).await.expect("write");
        let mut echoed = vec![0; text.len()];
        timeout(REPLY, stream.read_exact(&mut echoed))
            .await
            .expect("the echo comes back in time")
            .expect("read the echo");
        assert_eq!(echoed, text);
    }

    /// Sends `text`; nothing comes back within `SILENCE`, and the
    /// connection is neither closed nor reset.
    async fn silent(stream: &mut TcpStream, text: &[u8]) {
        stream.write_all(text).await.expect("write");
        let mut buf = [0; 64];
        match timeout(SILENCE, stream.read(&mut buf)).await {
            Err(_) => {}
            Ok(read) => panic!("a blackholed connection answered: {read:?}"),
        }
    }

    /// Waits until `condition` holds, for at most `REPLY`.
    async fn until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + REPLY;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn pass_forwards_both_ways_and_counts_connections() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).await;
        let mut first = connect(&proxy).await;
        let mut second = connect(&proxy).await;
        round_trip(&mut first, b"hello").await;
        round_trip(&mut second, b"world").await;
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open(), 2);
        drop(first);
        until("the closed connection is no longer open", || {
            proxy.open() == 1
        })
        .await;
        round_trip(&mut second, b"still there").await;
        assert_eq!(proxy.port(), proxy.addr().port());
    }

    #[tokio::test]
    async fn a_blackhole_forwards_nothing_and_its_connections_stay_dead_after_the_heal() {
        let (echo, echo_accepted) = echo_server().await;
        let proxy = FaultProxy::start(echo).await;
        let mut old = connect(&proxy).await;
        round_trip(&mut old, b"before").await;

        proxy.set(Mode::Blackhole);
        silent(&mut old, b"into the void").await;
        // New connections are accepted, and reach nothing.
        let mut born_dead = connect(&proxy).await;
        silent(&mut born_dead, b"anyone?").await;
        assert_eq!(proxy.accepted(), 2);
        assert_eq!(proxy.open(), 2, "the blackhole keeps its connections open");
        assert_eq!(proxy.open_dead(), 2);
        assert_eq!(echo_accepted.load(SeqCst), 1, "nothing reached the server");

        proxy.set(Mode::Pass);
        silent(&mut old, b"healed?").await;
        silent(&mut born_dead, b"healed?").await;
        let mut new = connect(&proxy).await;
        round_trip(&mut new, b"after").await;
        assert_eq!(proxy.open(), 3);
        assert_eq!(proxy.open_dead(), 2, "the heal brings no connection back");

        // Its client's close is seen; its server never hears of it.
        drop(old);
        until("the dead connection's close is counted", || {
            proxy.open() == 2
        })
        .await;
        assert_eq!(proxy.open_dead(), 1);
        assert_eq!(echo_accepted.load(SeqCst), 2);
    }

    #[tokio::test]
    async fn reset_gives_the_client_a_connection_reset_now_and_for_new_connections() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).await;
        let mut open = connect(&proxy).await;
        round_trip(&mut open, b"ping").await;

        proxy.set(Mode::Reset);
        let mut new = connect(&proxy).await;
        for stream in [&mut open, &mut new] {
            let mut buf = [0; 16];
            let read = timeout(REPLY, stream.read(&mut buf))
                .await
                .expect("the reset comes in time");
            let error = read.expect_err("the connection is reset");
            assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
        }
        until("no connection is open", || proxy.open() == 0).await;
        assert_eq!(proxy.accepted(), 2);

        proxy.set(Mode::Pass);
        round_trip(&mut connect(&proxy).await, b"back").await;
    }

    #[tokio::test]
    async fn latency_delays_each_way_and_keeps_the_order() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).await;
        let mut stream = connect(&proxy).await;
        round_trip(&mut stream, b"warm").await;

        let delay = Duration::from_millis(200);
        proxy.set(Mode::Latency(delay));
        let started = Instant::now();
        // Three chunks in a row: each waits its own delay, not the sum.
        for chunk in [&b"one "[..], b"two ", b"three"] {
            stream.write_all(chunk).await.expect("write");
        }
        let mut echoed = vec![0; b"one two three".len()];
        timeout(REPLY, stream.read_exact(&mut echoed))
            .await
            .expect("the echo comes back")
            .expect("read");
        let took = started.elapsed();
        assert_eq!(echoed, b"one two three");
        assert!(took >= 2 * delay, "there and back took {took:?}");
        assert!(took < 6 * delay, "the chunks waited in a queue: {took:?}");

        proxy.set(Mode::Pass);
        let started = Instant::now();
        round_trip(&mut stream, b"fast again").await;
        assert!(started.elapsed() < delay, "{:?}", started.elapsed());
    }

    #[tokio::test]
    async fn dropping_the_proxy_stops_it() {
        let (echo, _) = echo_server().await;
        let proxy = FaultProxy::start(echo).await;
        let addr = proxy.addr();
        let mut stream = connect(&proxy).await;
        round_trip(&mut stream, b"ping").await;
        drop(proxy);
        let mut buf = [0; 16];
        let read = timeout(REPLY, stream.read(&mut buf))
            .await
            .expect("the connection ends");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        let refused = timeout(REPLY, TcpStream::connect(addr)).await;
        assert!(matches!(refused, Ok(Err(_))), "{refused:?}");
    }
}

/// This process's TCP sockets whose far end is loopback port `port`.
#[cfg_attr(not(feature = "amqp"), allow(dead_code))]
pub fn sockets_to(port: u16) -> usize {
    let mine: std::collections::HashSet<u64> = std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            target
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect();
    let mut count = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            // sl local_address rem_address st tx:rx tr:when retrnsmt uid
            // timeout inode …
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(remote), Some(inode)) = (fields.get(2), fields.get(9)) else {
                continue;
            };
            let remote_port = remote
                .rsplit_once(':')
                .and_then(|(_, port)| u16::from_str_radix(port, 16).ok());
            let inode: u64 = inode.parse().unwrap_or(0);
            if remote_port == Some(port) && inode != 0 && mine.contains(&inode) {
                count += 1;
            }
        }
    }
    count
}
