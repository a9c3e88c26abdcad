//! The server on a socket keeps what one client may hold bounded (SPEC 3): a head sent a byte
//! at a time and a connection that sends nothing are closed within their timeouts, and at the
//! connection cap the probes still answer.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use envlens::config::{ConnectionLimits, Limits};
use envlens::state::AppState;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

struct Server {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    _database: postgres::TestDatabase,
}

impl Server {
    async fn start(connections: ConnectionLimits) -> Self {
        let db = postgres::fresh_database().await;
        let limits = Limits {
            connections,
            ..Limits::default()
        };
        let state = AppState::new((*db).clone(), keys(), limits);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(envlens::run(
            state,
            listener,
            async { stopped.await.unwrap_or(()) },
            Duration::from_secs(5),
        ));
        Server {
            addr,
            stop: Some(stop),
            task,
            _database: db,
        }
    }

    async fn connect(&self) -> TcpStream {
        TcpStream::connect(self.addr).await.unwrap()
    }

    async fn metric(&self, name: &str) -> i64 {
        let mut client = self.connect().await;
        let text = exchange(
            &mut client,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .trim()
            .parse()
            .unwrap()
    }

    async fn stop(mut self) {
        self.stop.take().unwrap().send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}

/// Sends `request` and reads until the server closes the connection.
async fn exchange(client: &mut TcpStream, request: &str) -> String {
    client.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// How long until the server closes `client` (reads EOF or a reset), reading anything it sends.
async fn closed_after(client: &mut TcpStream, started: Instant, within: Duration) -> Duration {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at((started + within).into(), client.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => continue,
            Err(_) => panic!("still open after {within:?}"),
        }
    }
}

fn timeouts(header: u64, idle: u64) -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_millis(header),
        idle_timeout: Duration::from_millis(idle),
        ..ConnectionLimits::default()
    }
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_cut_off() {
    let server = Server::start(timeouts(1000, 5000)).await;
    let mut client = server.connect().await;
    let started = Instant::now();
    let head = b"GET /-/liveness HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let writer = async {
        for byte in head {
            if client.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(3), writer)
        .await
        .expect("writes fail once closed");
    let elapsed = closed_after(&mut client, started, Duration::from_secs(3)).await;
    assert!(elapsed >= Duration::from_millis(900), "{elapsed:?}");
    assert_eq!(
        server
            .metric("envlens_http_connections_timed_out_total")
            .await,
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn connections_that_send_nothing_are_closed() {
    let server = Server::start(timeouts(1000, 2500)).await;
    // A new connection that never sends: the head timeout, from its opening.
    let mut silent = server.connect().await;
    let started = Instant::now();
    let elapsed = closed_after(&mut silent, started, Duration::from_secs(3)).await;
    assert!(
        elapsed >= Duration::from_millis(900) && elapsed < Duration::from_millis(2000),
        "{elapsed:?}"
    );

    // A keep-alive connection after its answer: the idle timeout, longer than the head's.
    let mut kept = server.connect().await;
    kept.write_all(b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    let answered = Instant::now();
    let elapsed = closed_after(&mut kept, answered, Duration::from_secs(5)).await;
    assert!(
        elapsed >= Duration::from_millis(2400) && elapsed < Duration::from_millis(4000),
        "{elapsed:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn at_the_cap_the_probes_still_answer() {
    let server = Server::start(ConnectionLimits {
        max_connections: 3,
        reserved_connections: 2,
        ..ConnectionLimits::default()
    })
    .await;
    // The cap, held by connections that send nothing.
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(server.connect().await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Beyond it, the reserve answers the probes, the metrics and GitLab, one request each.
    let mut probe = server.connect().await;
    let answer = exchange(&mut probe, "GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    let mut internal = server.connect().await;
    let answer = exchange(
        &mut internal,
        "PUT /api/v4/internal/identity HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    // ... and nothing else.
    let mut other = server.connect().await;
    let answer = exchange(
        &mut other,
        "POST /api/graphql HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too many connections"), "{answer}");

    // With the reserve held too, a connection is closed as soon as it is accepted.
    for _ in 0..2 {
        held.push(server.connect().await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut refused = server.connect().await;
    let started = Instant::now();
    closed_after(&mut refused, started, Duration::from_secs(1)).await;

    // Once the held connections go, /metrics has the count: the 503 and the closed one.
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        server
            .metric("envlens_http_connections_refused_total")
            .await,
        2
    );
    assert_eq!(server.metric("envlens_http_connections_open").await, 1);
    server.stop().await;
}
