//! An SMTP server on loopback for the e-mail tests: it accepts every e-mail
//! and keeps it in memory, where the test reads it.
//!
//! [`SmtpSink::start`] listens on `127.0.0.1:0`; the code under test sends
//! to [`SmtpSink::addr`] over a real SMTP conversation (minishop's lettre
//! client, from a child process), and the test reads
//! [`SmtpSink::received`]. The sink speaks the part of SMTP (RFC 5321) that
//! hands over mail:
//!
//! - the greeting `220`; `EHLO` (`250`, offering 8BITMIME and SMTPUTF8:
//!   the sink keeps the bytes it gets) and `HELO`;
//! - `MAIL FROM:<path>` (its parameters ignored), `RCPT TO:<path>`, `DATA`
//!   (`354`, then the message up to the line with a lone `.`, each line's
//!   leading dot of transparency removed), `RSET`, `NOOP`, `QUIT` (`221`,
//!   then it closes);
//! - `503` for a command out of order, `501` for a malformed one, `502`
//!   for the commands of SMTP it does not implement (`VRFY`, `EXPN`,
//!   `HELP`, `STARTTLS`, `AUTH`, …), `500` for anything else.
//!
//! No TLS, no authentication, no size limits: it is for tests on loopback.
//!
//! An e-mail is recorded when the line with the lone `.` arrives, before
//! the sink replies `250`: a client that has its `250` knows the test sees
//! the e-mail. A connection that ends before that line (its client killed
//! mid-DATA) records nothing.
//!
//! Each connection runs in a task of its own, so several clients send at
//! once. Dropping the sink stops it: the accept loop and every connection's
//! task are aborted, and their sockets closed.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// The name the sink gives itself in its greeting and its EHLO reply.
const NAME: &str = "smtp-sink.test";

/// An e-mail the sink accepted.
#[derive(Debug, Clone)]
pub struct Mail {
    /// The reverse path of `MAIL FROM`, without its angle brackets (empty
    /// for the null path `<>`).
    pub from: String,
    /// The forward paths of `RCPT TO`, in order, without angle brackets.
    pub to: Vec<String>,
    /// The message as it arrived, dot-unstuffed: its header and its body,
    /// every line with its CRLF, up to the line with the lone `.`.
    pub content: Vec<u8>,
}

impl Mail {
    /// The header `name` (case-insensitive; the first, if there are
    /// several), unfolded and trimmed.
    pub fn header(&self, name: &str) -> Option<String> {
        let text = String::from_utf8_lossy(&self.content);
        let mut found: Option<String> = None;
        for line in text.split("\r\n") {
            if line.is_empty() {
                // The end of the header.
                break;
            }
            if line.starts_with([' ', '\t']) {
                // A folded line continues the field before it.
                if let Some(value) = found.as_mut() {
                    value.push_str(line);
                }
                continue;
            }
            if found.is_some() {
                break;
            }
            if let Some((field, value)) = line.split_once(':') {
                if field.trim().eq_ignore_ascii_case(name) {
                    found = Some(value.to_string());
                }
            }
        }
        found.map(|value| value.trim().to_string())
    }

    /// The `Message-ID` header.
    pub fn message_id(&self) -> Option<String> {
        self.header("Message-ID")
    }

    /// The body: what follows the empty line that ends the header.
    pub fn body(&self) -> &[u8] {
        let content = &self.content[..];
        if content.starts_with(b"\r\n") {
            return &content[2..];
        }
        match content.windows(4).position(|w| w == b"\r\n\r\n") {
            Some(at) => &content[at + 4..],
            None => &[],
        }
    }
}

/// A running sink; dropping it stops it.
pub struct SmtpSink {
    /// Where clients connect.
    addr: SocketAddr,
    /// The e-mails and the counts, shared with the connections' tasks.
    shared: Arc<Shared>,
    /// The accept loop; it owns every connection's task (in a `JoinSet`),
    /// so aborting it aborts them all.
    accepting: JoinHandle<()>,
}

/// What the sink and its tasks share.
struct Shared {
    /// The e-mails accepted, in the order their data ended.
    received: Mutex<Vec<Mail>>,
    /// Connections accepted.
    accepted: AtomicUsize,
    /// Connections whose task still runs: a test waits for a cut
    /// connection to be done with before it looks at what was recorded.
    open: AtomicUsize,
}

impl SmtpSink {
    /// Starts a sink on a free port of loopback, on the current tokio
    /// runtime. It listens when this returns (connections wait in the
    /// kernel's backlog until the accept loop takes them). Its tasks run on
    /// that runtime: from a test that blocks its thread, use a multi-thread
    /// runtime.
    pub async fn start() -> SmtpSink {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the SMTP sink binds a port on loopback");
        let addr = listener.local_addr().expect("the sink's address");
        let shared = Arc::new(Shared {
            received: Mutex::new(Vec::new()),
            accepted: AtomicUsize::new(0),
            open: AtomicUsize::new(0),
        });
        let accepting = tokio::spawn(accept(listener, shared.clone()));
        SmtpSink {
            addr,
            shared,
            accepting,
        }
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The e-mails accepted so far, in order, repeats included.
    pub fn received(&self) -> Vec<Mail> {
        self.shared
            .received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }

    /// Connections open now: accepted, and not yet ended by either side.
    pub fn open(&self) -> usize {
        self.shared.open.load(SeqCst)
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// Accepts connections until the sink is dropped; each runs in a task of
/// the `JoinSet`, which aborts them all when this future is dropped.
async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.accepted.fetch_add(1, SeqCst);
                    connections.spawn(connection(stream, shared.clone()));
                }
                // Out of file descriptors, say: not a hot loop.
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            },
            // Reaps finished connections, so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as open while it lives (an aborted task too).
struct Open(Arc<Shared>);

impl Open {
    fn new(shared: &Arc<Shared>) -> Self {
        shared.open.fetch_add(1, SeqCst);
        Open(shared.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, SeqCst);
    }
}

/// Runs one connection until the client quits or goes away.
async fn connection(mut stream: TcpStream, shared: Arc<Shared>) {
    let _open = Open::new(&shared);
    // Replies are single writes; without Nagle's algorithm none waits for
    // the client to acknowledge the one before.
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.split();
    let mut read = BufReader::new(read);
    // A broken connection just ends: whatever it left unfinished is not
    // recorded.
    let _ = converse(&mut read, &mut write, &shared).await;
}

/// The mail transaction under way: what `MAIL` and `RCPT` gave.
#[derive(Default)]
struct Transaction {
    from: Option<String>,
    to: Vec<String>,
}

/// One SMTP session, from the greeting to `QUIT` or the end of the stream.
async fn converse(
    read: &mut (impl AsyncBufRead + Unpin),
    write: &mut (impl AsyncWrite + Unpin),
    shared: &Shared,
) -> io::Result<()> {
    reply(write, &format!("220 {NAME} ESMTP ready")).await?;
    let mut greeted = false;
    let mut transaction = Transaction::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        if read.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let line = String::from_utf8_lossy(&line);
        let line = line.trim_end_matches(['\r', '\n']);
        let (verb, argument) = line.split_once(' ').unwrap_or((line, ""));
        let argument = argument.trim();
        let answer = match verb.to_ascii_uppercase().as_str() {
            "EHLO" | "HELO" if argument.is_empty() => format!("501 Syntax: {verb} domain"),
            "EHLO" => {
                greeted = true;
                transaction = Transaction::default();
                format!("250-{NAME} greets {argument}\r\n250-8BITMIME\r\n250 SMTPUTF8")
            }
            "HELO" => {
                greeted = true;
                transaction = Transaction::default();
                format!("250 {NAME}")
            }
            "MAIL" if !greeted => "503 Send EHLO or HELO first".into(),
            "MAIL" if transaction.from.is_some() => "503 Nested MAIL command".into(),
            "MAIL" => match path(argument, "FROM:") {
                Some(from) => {
                    transaction.from = Some(from);
                    "250 OK".into()
                }
                None => "501 Syntax: MAIL FROM:<address>".into(),
            },
            "RCPT" if transaction.from.is_none() => "503 Need MAIL before RCPT".into(),
            "RCPT" => match path(argument, "TO:") {
                Some(to) if !to.is_empty() => {
                    transaction.to.push(to);
                    "250 OK".into()
                }
                _ => "501 Syntax: RCPT TO:<address>".into(),
            },
            "DATA" if transaction.to.is_empty() => "503 Need RCPT before DATA".into(),
            "DATA" if !argument.is_empty() => "501 Syntax: DATA".into(),
            "DATA" => {
                reply(write, "354 End data with <CR><LF>.<CR><LF>").await?;
                let Some(content) = read_data(read).await? else {
                    // The client went away mid-DATA.
                    return Ok(());
                };
                let Transaction { from, to } = std::mem::take(&mut transaction);
                let mail = Mail {
                    from: from.unwrap_or_default(),
                    to,
                    content,
                };
                let id = mail.message_id().unwrap_or_else(|| "-".into());
                // Recorded before the 250, which tells the client it is.
                shared
                    .received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(mail);
                format!("250 OK queued as {id}")
            }
            "RSET" => {
                transaction = Transaction::default();
                "250 OK".into()
            }
            "NOOP" => "250 OK".into(),
            "QUIT" => {
                reply(write, &format!("221 {NAME} closing")).await?;
                return Ok(());
            }
            "VRFY" | "EXPN" | "HELP" | "STARTTLS" | "AUTH" | "TURN" | "ETRN" | "BDAT" => {
                "502 Command not implemented".into()
            }
            _ => "500 Command unrecognized".into(),
        };
        reply(write, &answer).await?;
    }
}

/// The path of `MAIL FROM:<path> [parameters]` or `RCPT TO:<path>
/// [parameters]`, from the command's argument and its keyword (`FROM:`,
/// `TO:`, matched without regard to case): what is between the angle
/// brackets.
fn path(argument: &str, keyword: &str) -> Option<String> {
    let head = argument.get(..keyword.len())?;
    if !head.eq_ignore_ascii_case(keyword) {
        return None;
    }
    let rest = argument[keyword.len()..].trim_start();
    let (path, _parameters) = rest.strip_prefix('<')?.split_once('>')?;
    Some(path.to_string())
}

/// Reads a message's data up to the line with a lone `.`, removing the
/// leading dot the client added to each line that began with one (RFC 5321
/// 4.5.2); `None` if the stream ends first. A line ends at CRLF: a bare LF
/// is part of its line, as the client's transparency treats it.
async fn read_data(read: &mut (impl AsyncBufRead + Unpin)) -> io::Result<Option<Vec<u8>>> {
    let mut content = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        while !line.ends_with(b"\r\n") {
            if read.read_until(b'\n', &mut line).await? == 0 {
                return Ok(None);
            }
        }
        if line == b".\r\n" {
            return Ok(Some(content));
        }
        content.extend_from_slice(line.strip_prefix(b".").unwrap_or(&line));
    }
}

/// Writes a reply: its lines, the last one ended with CRLF.
async fn reply(write: &mut (impl AsyncWrite + Unpin), text: &str) -> io::Result<()> {
    write.write_all(format!("{text}\r\n").as_bytes()).await?;
    write.flush().await
}

/// The sink, with lettre (the client minishop sends with) and by hand.
mod tests {
    use super::{Mail, SmtpSink};
    use lettre::message::header::ContentType;
    use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
    use tokio::net::TcpStream;
    use tokio::time::{timeout, Instant};

    /// How long a reply, or a condition that should come true, may take.
    const REPLY: Duration = Duration::from_secs(10);

    /// lettre's transport to the sink: plain SMTP, a new connection per
    /// e-mail.
    fn transport(sink: &SmtpSink) -> AsyncSmtpTransport<Tokio1Executor> {
        AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous("127.0.0.1")
            .port(sink.addr().port())
            .timeout(Some(REPLY))
            .build()
    }

    /// An e-mail from the shop to `to`, with Message-ID `<n@sink.test>`.
    fn email(n: usize, to: &str, body: &str) -> Message {
        Message::builder()
            .message_id(Some(format!("<{n}@sink.test>")))
            .from("Shop <shop@sink.test>".parse().expect("from"))
            .to(to.parse().expect("to"))
            .subject(format!("e-mail {n}"))
            .header(ContentType::TEXT_PLAIN)
            .body(body.to_string())
            .expect("an e-mail")
    }

    /// Sends `email` with lettre; returns the sink's reply to the data.
    async fn send(sink: &SmtpSink, email: Message) -> String {
        let response = timeout(REPLY, transport(sink).send(email))
            .await
            .expect("lettre sends within the timeout")
            .expect("the sink accepts the e-mail");
        let lines: Vec<&str> = response.message().collect();
        format!("{} {}", response.code(), lines.join(" "))
    }

    /// The Message-IDs of `mails`, in order.
    fn ids(mails: &[Mail]) -> Vec<String> {
        mails
            .iter()
            .map(|mail| mail.message_id().unwrap_or_default())
            .collect()
    }

    /// Waits until `condition` holds, for at most `REPLY`.
    async fn until(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + REPLY;
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// A client that speaks SMTP by hand, a line at a time.
    struct Client {
        read: BufReader<OwnedReadHalf>,
        write: OwnedWriteHalf,
    }

    impl Client {
        /// Connects and reads the greeting.
        async fn connect(sink: &SmtpSink) -> Client {
            let stream = TcpStream::connect(sink.addr()).await.expect("connect");
            let (read, write) = stream.into_split();
            let mut client = Client {
                read: BufReader::new(read),
                write,
            };
            let greeting = client.reply().await;
            assert!(greeting.starts_with("220 "), "{greeting}");
            client
        }

        /// Sends raw bytes.
        async fn send(&mut self, bytes: &[u8]) {
            self.write.write_all(bytes).await.expect("write");
        }

        /// Reads one reply, every line of it, within `REPLY`.
        async fn reply(&mut self) -> String {
            let mut reply = String::new();
            loop {
                let mut line = String::new();
                let read = timeout(REPLY, self.read.read_line(&mut line))
                    .await
                    .expect("a reply in time")
                    .expect("read a reply");
                assert!(
                    read > 0,
                    "the sink closed the connection; so far: {reply:?}"
                );
                reply.push_str(&line);
                // The last line of a reply has a space after its code.
                if line.as_bytes().get(3) != Some(&b'-') {
                    return reply;
                }
            }
        }

        /// Sends `command` and returns the reply.
        async fn say(&mut self, command: &str) -> String {
            self.send(format!("{command}\r\n").as_bytes()).await;
            self.reply().await
        }

        /// Greets, names the sender and one recipient, and starts the data.
        async fn start_data(&mut self, from: &str, to: &str) {
            for (command, code) in [
                ("EHLO client.test".to_string(), "250"),
                (format!("MAIL FROM:<{from}>"), "250"),
                (format!("RCPT TO:<{to}>"), "250"),
                ("DATA".to_string(), "354"),
            ] {
                let reply = self.say(&command).await;
                assert!(reply.starts_with(code), "{command}: {reply}");
            }
        }
    }

    #[tokio::test]
    async fn one_email_arrives_with_its_message_id_sender_and_recipients() {
        let sink = SmtpSink::start().await;
        let email = Message::builder()
            .message_id(Some("<1@sink.test>".into()))
            .from("Shop <shop@sink.test>".parse().expect("from"))
            .to("Ann <ann@sink.test>".parse().expect("to"))
            .cc("bob@sink.test".parse().expect("cc"))
            .subject("e-mail 1")
            .header(ContentType::TEXT_PLAIN)
            .body("Hello,\r\n\r\nyour order.\r\n".to_string())
            .expect("an e-mail");
        let formatted = email.formatted();
        let reply = send(&sink, email.clone()).await;
        assert_eq!(reply, "250 OK queued as <1@sink.test>");

        let received = sink.received();
        assert_eq!(received.len(), 1, "{received:?}");
        let mail = &received[0];
        assert_eq!(mail.from, "shop@sink.test");
        assert_eq!(mail.to, ["ann@sink.test", "bob@sink.test"]);
        assert_eq!(mail.message_id().as_deref(), Some("<1@sink.test>"));
        assert_eq!(mail.header("subject").as_deref(), Some("e-mail 1"));
        // The message as lettre made it; the CRLF before the final `.` ends
        // its last line.
        assert_eq!(mail.content, [&formatted[..], b"\r\n"].concat());
        assert_eq!(mail.body(), b"Hello,\r\n\r\nyour order.\r\n\r\n");
        // lettre ended with QUIT: the connection is over.
        until("the connection is closed", || sink.open() == 0).await;
        assert_eq!(sink.accepted(), 1);
    }

    #[tokio::test]
    async fn several_emails_sent_at_once_each_arrive_once_beside_a_slow_one() {
        let sink = SmtpSink::start().await;
        // A client that stops half-way through its data, holding its
        // connection open while the others send.
        let mut slow = Client::connect(&sink).await;
        slow.start_data("slow@sink.test", "ann@sink.test").await;
        slow.send(b"Message-ID: <slow@sink.test>\r\n\r\nhalf").await;

        let sending = (1..=10).map(|n| {
            let sink = &sink;
            async move { send(sink, email(n, "ann@sink.test", "Hello.")).await }
        });
        let replies = futures_util::future::join_all(sending).await;
        assert_eq!(replies.len(), 10);
        let mut got = ids(&sink.received());
        got.sort();
        let mut sent: Vec<String> = (1..=10).map(|n| format!("<{n}@sink.test>")).collect();
        sent.sort();
        assert_eq!(got, sent, "each e-mail once, the slow one not yet");

        slow.send(b" done\r\n.\r\n").await;
        let reply = slow.reply().await;
        assert_eq!(reply, "250 OK queued as <slow@sink.test>\r\n");
        let received = sink.received();
        assert_eq!(received.len(), 11);
        assert_eq!(received[10].body(), b"half done\r\n");
        assert_eq!(received[10].from, "slow@sink.test");
        assert_eq!(sink.accepted(), 11);
    }

    #[tokio::test]
    async fn lines_that_begin_with_a_dot_arrive_as_they_were_written() {
        let sink = SmtpSink::start().await;
        let body = ".\r\n.leading dot\r\n..two dots\r\nin the middle .\r\n.\r\n...\r\nlast\r\n";
        let email = email(1, "ann@sink.test", body);
        let formatted = email.formatted();
        send(&sink, email).await;
        let received = sink.received();
        assert_eq!(received.len(), 1);
        assert_eq!(
            String::from_utf8_lossy(received[0].body()),
            format!("{body}\r\n")
        );
        assert_eq!(received[0].content, [&formatted[..], b"\r\n"].concat());
    }

    #[tokio::test]
    async fn a_connection_cut_mid_data_records_nothing_and_the_sink_goes_on() {
        let sink = SmtpSink::start().await;
        // Cut in the middle of a line, after a whole line, and after the
        // final dot but before its CRLF; closed, then reset.
        let cuts: [&[u8]; 3] = [b"Subject: cut\r\n\r\nhal", b"whole line\r\n", b"body\r\n."];
        for (i, cut) in cuts.into_iter().enumerate() {
            for reset in [false, true] {
                let mut client = Client::connect(&sink).await;
                client.start_data("shop@sink.test", "ann@sink.test").await;
                client
                    .send(format!("Message-ID: <cut-{i}-{reset}@sink.test>\r\n").as_bytes())
                    .await;
                client.send(cut).await;
                let Client { read, write } = client;
                let stream = read
                    .into_inner()
                    .reunite(write)
                    .expect("the halves of one stream");
                if reset {
                    stream.set_zero_linger().expect("linger 0: a RST on close");
                }
                drop(stream);
            }
        }
        until("the sink is done with every cut connection", || {
            sink.open() == 0
        })
        .await;
        assert_eq!(sink.accepted(), 6);
        assert!(sink.received().is_empty(), "{:?}", sink.received());

        send(&sink, email(1, "ann@sink.test", "after the cuts")).await;
        assert_eq!(ids(&sink.received()), ["<1@sink.test>"]);
    }

    #[tokio::test]
    async fn the_conversation_follows_rfc_5321() {
        let sink = SmtpSink::start().await;
        let mut client = Client::connect(&sink).await;
        let expect = [
            ("NOOP", "250 OK\r\n"),
            ("MAIL FROM:<a@sink.test>", "503 Send EHLO or HELO first\r\n"),
            ("HELO", "501 Syntax: HELO domain\r\n"),
            ("HELO client.test", "250 smtp-sink.test\r\n"),
            ("RCPT TO:<b@sink.test>", "503 Need MAIL before RCPT\r\n"),
            ("DATA", "503 Need RCPT before DATA\r\n"),
            (
                "MAIL TO:<a@sink.test>",
                "501 Syntax: MAIL FROM:<address>\r\n",
            ),
            ("mail from:<a@sink.test> BODY=8BITMIME", "250 OK\r\n"),
            ("MAIL FROM:<a@sink.test>", "503 Nested MAIL command\r\n"),
            ("RCPT TO:<>", "501 Syntax: RCPT TO:<address>\r\n"),
            ("RSET", "250 OK\r\n"),
            ("RCPT TO:<b@sink.test>", "503 Need MAIL before RCPT\r\n"),
            ("VRFY b@sink.test", "502 Command not implemented\r\n"),
            ("STARTTLS", "502 Command not implemented\r\n"),
            ("XYZZY", "500 Command unrecognized\r\n"),
            ("", "500 Command unrecognized\r\n"),
            (
                "EHLO client.test",
                "250-smtp-sink.test greets client.test\r\n250-8BITMIME\r\n250 SMTPUTF8\r\n",
            ),
            ("MAIL FROM:<>", "250 OK\r\n"),
            ("RCPT TO: <b@sink.test>", "250 OK\r\n"),
            ("RCPT TO:<c@sink.test>", "250 OK\r\n"),
            ("DATA", "354 End data with <CR><LF>.<CR><LF>\r\n"),
        ];
        for (command, reply) in expect {
            assert_eq!(client.say(command).await, reply, "{command}");
        }
        // A bare LF is part of its line: the dot after it is data.
        client
            .send(b"Subject: by hand\r\n\r\n..one\r\nbare\n.lf\r\n.\r\n")
            .await;
        assert_eq!(client.reply().await, "250 OK queued as -\r\n");
        // The transaction is over; the session goes on.
        assert_eq!(client.say("DATA").await, "503 Need RCPT before DATA\r\n");
        assert_eq!(client.say("QUIT").await, "221 smtp-sink.test closing\r\n");
        let mut rest = String::new();
        let read = timeout(REPLY, client.read.read_line(&mut rest)).await;
        assert!(matches!(read, Ok(Ok(0))), "closed after QUIT: {read:?}");

        let received = sink.received();
        assert_eq!(received.len(), 1);
        let mail = &received[0];
        assert_eq!(mail.from, "");
        assert_eq!(mail.to, ["b@sink.test", "c@sink.test"]);
        assert_eq!(mail.message_id(), None);
        assert_eq!(mail.header("SUBJECT").as_deref(), Some("by hand"));
        assert_eq!(mail.body(), b".one\r\nbare\n.lf\r\n");
    }

    #[test]
    fn a_header_is_found_without_regard_to_case_and_unfolded() {
        let mail = Mail {
            from: String::new(),
            to: Vec::new(),
            content: b"Subject: one\r\nmessage-id:\r\n <folded@sink.test>\r\n\r\nMessage-ID: <body@sink.test>\r\n".to_vec(),
        };
        assert_eq!(mail.message_id().as_deref(), Some("<folded@sink.test>"));
        assert_eq!(mail.header("Subject").as_deref(), Some("one"));
        assert_eq!(mail.header("To"), None);
        assert_eq!(mail.body(), b"Message-ID: <body@sink.test>\r\n");
    }
}
