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

/// The real process under a low open-files limit (400, soft and hard, as `ulimit -n` sets
/// it in a container): the connection cap is derived from it and said at start-up, and with
/// more connections held than the process could ever open, the probes still answer.
#[tokio::test]
async fn under_a_low_open_files_limit_the_probes_still_answer() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    let (database_url, _database) = crate::telemetry::database_url().await;
    let mut command = Command::new(env!("CARGO_BIN_EXE_envlens"));
    command
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--database-url",
            &database_url,
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env("ENVLENS_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit only reads the struct passed; nothing else runs between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 400,
                rlim_max: 400,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().expect("envlens serve");
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let lines = stderr.clone();
    let pipe = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            lines.lock().unwrap().push(line);
        }
    });
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let addr: SocketAddr = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap() > 0 {
            if let Some(at) = line.find("listening on http://") {
                let host = line[at + 20..].split([';', '/']).next().unwrap().to_owned();
                std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
                return host.parse().unwrap();
            }
            line.clear();
        }
        panic!("serve exited before listening");
    })
    .await
    .unwrap();
    // 400 less the 256 kept for the database, the clusters and files: 144, three quarters of
    // them the public listener's (the internal one has the rest): 108, of which 13 (an eighth)
    // are the reserve.
    // (The log's lines are written in batches, by a thread of their own.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let caps = loop {
        let found = stderr
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("connection caps") && l.contains("listener=Public"))
            .cloned();
        match found {
            Some(line) => break line,
            None if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            None => panic!("no caps said: {:#?}", stderr.lock().unwrap()),
        }
    };
    assert!(caps.contains("max_connections=95"), "{caps}");
    assert!(caps.contains("reserved_connections=13"), "{caps}");
    assert!(
        caps.contains("open_files=\"400\"") || caps.contains("open_files=400"),
        "{caps}"
    );

    // 450 keep-alive clients, each with a request answered and the connection then held.
    let mut held = Vec::new();
    for _ in 0..450 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET /-/liveness HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        held.push(client);
    }
    // Probed as the kubelet probes: a connection of its own each time, and three answers in a
    // row wanted (while the server still works through the clients' backlog, a probe may find
    // the reserve taken, and is closed at once: a failed probe, not a hung one).
    let probe = || async {
        let mut probe = TcpStream::connect(addr).await.ok()?;
        probe
            .write_all(b"GET /-/liveness HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), probe.read_to_end(&mut answer))
            .await
            .ok()?
            .ok()?;
        answer.starts_with(b"HTTP/1.1 200").then_some(())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut in_a_row = 0;
    while in_a_row < 3 {
        assert!(Instant::now() < deadline, "the probes got no answer");
        match probe().await {
            Some(()) => in_a_row += 1,
            None => {
                in_a_row = 0;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
}
