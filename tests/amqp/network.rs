//! A network between the tests and the broker that the tests can break,
//! and a count of the sockets this process holds towards it.
//!
//! - [`Proxy`] forwards loopback connections to the broker until it is
//!   told to go silent: then it keeps every connection open and forwards
//!   nothing, and takes new connections without answering them (its
//!   kernel still acknowledges every byte, so only the client's own
//!   deadlines notice). Once it forwards again, it does so for new
//!   connections only: those it held while silent stay dead.
//! - [`SilentPort`] takes TCP connections and never says a word: a broker
//!   that hangs in the handshake.
//! - [`sockets_to`] counts this process's TCP sockets whose far end is a
//!   port: tickbox's connections through the proxy, or its attempts on the
//!   silent port. Sockets of tests running beside this one (databases,
//!   other brokers' ports) are not counted.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does with the connections of one era: forward them, or
/// hold them without a word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Era {
    /// Changes whenever the proxy goes silent or forwards again: a
    /// connection forwards only in the era it was taken in.
    number: u64,
    /// Whether the era's connections are forwarded.
    forwarding: bool,
}

/// A proxy in front of the broker that can go silent.
pub struct Proxy {
    /// The port tickbox connects to.
    pub port: u16,
    /// The current era.
    era: watch::Sender<Era>,
    /// Connections taken so far.
    accepted: Arc<AtomicUsize>,
    /// The accepting task and every connection's tasks, stopped when the
    /// proxy drops.
    _tasks: JoinSet<()>,
}

impl Proxy {
    /// A forwarding proxy in front of the broker at `upstream` (`host:port`).
    pub async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let (era, _) = watch::channel(Era {
            number: 0,
            forwarding: true,
        });
        let accepted = Arc::new(AtomicUsize::new(0));
        let mut tasks = JoinSet::new();
        let eras = era.subscribe();
        let count = accepted.clone();
        tasks.spawn(async move {
            // Every connection's tasks live here, so they stop with the
            // proxy.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    taken = listener.accept() => {
                        let Ok((client, _)) = taken else { continue };
                        count.fetch_add(1, SeqCst);
                        let taken_in = *eras.borrow();
                        connections.spawn(relay(client, upstream.clone(), taken_in, eras.clone()));
                    }
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Proxy {
            port,
            era,
            accepted,
            _tasks: tasks,
        }
    }

    /// Stops forwarding: every open connection goes dead for good, new ones
    /// are taken and never answered.
    pub fn go_silent(&self) {
        self.era.send_modify(|era| {
            era.number += 1;
            era.forwarding = false;
        });
    }

    /// Forwards new connections again; those taken before stay dead.
    pub fn forward_again(&self) {
        self.era.send_modify(|era| {
            era.number += 1;
            era.forwarding = true;
        });
    }

    /// Connections taken so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(SeqCst)
    }
}

/// Carries one connection both ways while its era forwards; from then on,
/// holds it open and silent until the proxy drops.
async fn relay(client: TcpStream, upstream: String, taken_in: Era, eras: watch::Receiver<Era>) {
    if !taken_in.forwarding {
        // Taken while silent: never answered.
        return hold(client).await;
    }
    let Ok(broker) = TcpStream::connect(&upstream).await else {
        return;
    };
    let (client_in, client_out) = client.into_split();
    let (broker_in, broker_out) = broker.into_split();
    let alive = move |eras: &watch::Receiver<Era>| *eras.borrow() == taken_in;
    let up = pump(client_in, broker_out, alive, eras.clone());
    let down = pump(broker_in, client_out, alive, eras);
    tokio::join!(up, down);
}

/// Copies `from` to `to` while `alive`; once it is not, holds both ends
/// open and forwards nothing more.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    alive: impl Fn(&watch::Receiver<Era>) -> bool,
    eras: watch::Receiver<Era>,
) {
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = from.read(&mut buffer).await;
        if !alive(&eras) {
            return hold((from, to)).await;
        }
        match read {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => {
                if to.write_all(&buffer[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Holds `held` open, silent, until the proxy drops.
async fn hold<T>(held: T) {
    std::future::pending::<()>().await;
    drop(held);
}

/// A port that takes TCP connections and never answers them.
pub struct SilentPort {
    /// Its port.
    pub port: u16,
    /// Takes connections and holds them until the port drops.
    _task: JoinSet<()>,
}

impl SilentPort {
    pub async fn open() -> SilentPort {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let port = listener.local_addr().expect("its address").port();
        let mut task = JoinSet::new();
        task.spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                held.push(connection);
            }
        });
        SilentPort { port, _task: task }
    }
}

/// This process's TCP sockets whose far end is loopback port `port`.
pub fn sockets_to(port: u16) -> usize {
    let mine: HashSet<u64> = std::fs::read_dir("/proc/self/fd")
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
