//! A private PostgreSQL in the data folder, run from the machine's own PostgreSQL binaries.
//!
//! The server listens on a Unix socket only (no TCP port to collide with) and trusts local
//! connections: the socket folder is private to the user that runs it. When envlens runs as
//! root, PostgreSQL (which refuses root) runs as the `postgres` system user. The server dies
//! with envlens even on SIGKILL (`PR_SET_PDEATHSIG`); a second envlens command on the same data
//! folder (`envlens token` while `serve` runs) attaches to the running server instead.
//!
//! envlens started it, so envlens restarts it: a server that exits while envlens runs (killed,
//! crashed) is started again after a backoff (100 ms, doubling up to 10 s, back to 100 ms after
//! a run of a minute), logged and counted ([`EmbeddedPostgres::restarts`]). PostgreSQL recovers
//! from its write-ahead log, so every committed transaction is there again. Whoever needs to
//! know (the pool's health gate) hears of the exit through [`EmbeddedPostgres::on_exit`].

use std::fs;
use std::os::unix::fs::{chown, DirBuilderExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection, PgConnection};

/// The role and database envlens uses inside the embedded server.
pub const ROLE: &str = "envlens";
const PORT: u16 = 5432;
/// `sun_path` holds 108 bytes; PostgreSQL appends `/.s.PGSQL.5432`.
const MAX_SOCKET_DIR_LEN: usize = 90;

#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Where `initdb` and `postgres` live; found on the machine when not given.
    pub bin_dir: Option<PathBuf>,
    /// Trade durability for speed (`fsync=off`): for throwaway test servers only.
    pub ephemeral: bool,
}

pub struct EmbeddedPostgres {
    pgdata: PathBuf,
    socket_dir: PathBuf,
    port: u16,
    /// `None` when attached to a server another process started.
    server: Option<Server>,
}

/// The server process, as its supervising thread and the handle share it.
struct Server(Arc<Supervision>);

type ExitHook = Box<dyn Fn(&str) + Send + Sync>;

struct Supervision {
    state: Mutex<Supervised>,
    /// Signalled when `state` changes.
    changed: Condvar,
    restarts: Arc<AtomicU64>,
    on_exit: Mutex<Option<ExitHook>>,
}

struct Supervised {
    /// The running server's pid; `None` between an exit and the restart. Cleared before the
    /// exited process is reaped, so that a signal never reaches a pid used again.
    pid: Option<i32>,
    /// Restart on exit: set once the first start succeeded (a server that cannot start at all
    /// is an error to report, not to retry).
    armed: bool,
    stopping: bool,
    /// How the server ended when the supervision ended (stopped, or exited before armed).
    exited: Option<std::io::Result<ExitStatus>>,
}

/// First wait before a restart, doubled after each restart that did not last.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A run this long resets the backoff.
const STABLE_RUN: Duration = Duration::from_secs(60);

impl Server {
    fn lock(&self) -> MutexGuard<'_, Supervised> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn try_exited(&self) -> Option<std::io::Result<ExitStatus>> {
        self.lock().exited.take()
    }

    /// Stops supervising and signals the server; whether it ended within `timeout`.
    fn stop(&self, signal: i32, timeout: Duration) -> bool {
        let mut state = self.lock();
        state.stopping = true;
        if let Some(pid) = state.pid {
            // SAFETY: kill(2) on our child, not yet reaped (see `Supervised::pid`).
            unsafe { libc::kill(pid, signal) };
        }
        self.0.changed.notify_all();
        let (state, _) = self
            .0
            .changed
            .wait_timeout_while(state, timeout, |s| s.exited.is_none())
            .unwrap_or_else(|e| e.into_inner());
        state.exited.is_some()
    }
}

impl EmbeddedPostgres {
    /// Starts the server in `data_dir/postgres` (creating it on first use), or attaches to the
    /// one already running there. Blocks until it accepts connections.
    pub fn start(data_dir: &Path, options: &Options) -> anyhow::Result<Self> {
        fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data folder {}", data_dir.display()))?;
        let data_dir = data_dir.canonicalize()?;
        let owner = server_user()?;
        let cluster_dir = cluster_dir(&data_dir, owner)?;
        let pgdata = cluster_dir.join("postgres");
        if let Some(running) = Self::attach(&pgdata) {
            tracing::info!(pgdata = %pgdata.display(), "attached to the running embedded PostgreSQL");
            return Ok(running);
        }
        let bin_dir = match &options.bin_dir {
            Some(dir) => dir.clone(),
            None => find_bin_dir()?,
        };
        let log_path = data_dir.join("postgres.log");
        if !pgdata.join("PG_VERSION").exists() {
            init(&bin_dir, &pgdata, owner, options)?;
        }
        let socket_dir = socket_dir(&cluster_dir)?;
        make_private_dir(&socket_dir, owner)?;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)?;
        if let Some((uid, gid)) = owner {
            chown(&log_path, Some(uid), Some(gid))?;
        }

        let mut cmd = Command::new(bin_dir.join("postgres"));
        cmd.arg("-D")
            .arg(&pgdata)
            .arg("-k")
            .arg(&socket_dir)
            .args(["-p", &PORT.to_string(), "-c", "listen_addresses="])
            .args(["-c", "max_connections=200"]);
        if options.ephemeral {
            cmd.args(["-c", "fsync=off", "-c", "synchronous_commit=off"])
                .args(["-c", "full_page_writes=off"]);
        } else if major_version(&pgdata) >= 14 {
            // After a crash PostgreSQL first makes sure that what the dead server wrote is on
            // disk. File by file (the default) that is one fsync per file of the cluster, seconds
            // on a busy disk, before the restarted server accepts a connection; one `syncfs`
            // of the file system gives the same guarantee.
            cmd.args(["-c", "recovery_init_sync_method=syncfs"]);
        }
        cmd.current_dir("/")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: the terminal's Ctrl-C reaches envlens, which drains its
            // requests and then stops the server, instead of the server too (which would be
            // restarted in the meantime).
            .process_group(0);
        run_as(&mut cmd, owner, true);
        let server = spawn_supervised(cmd)?;
        let mut this = EmbeddedPostgres {
            pgdata: pgdata.clone(),
            socket_dir,
            port: PORT,
            server: Some(server),
        };
        this.wait_ready(&pgdata, &log_path)?;
        if let Some(server) = &this.server {
            server.lock().armed = true;
        }
        Ok(this)
    }

    /// How many times the server was started again after it exited (each attempt counts).
    pub fn restarts(&self) -> Arc<AtomicU64> {
        match &self.server {
            Some(server) => server.0.restarts.clone(),
            None => Arc::default(),
        }
    }

    /// Calls `hook` (on the supervising thread) with the reason each time the server exits
    /// while envlens runs, before it is started again.
    pub fn on_exit(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        if let Some(server) = &self.server {
            *server.0.on_exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(hook));
        }
    }

    /// The pid of the running server (the postmaster), if this handle started it.
    pub fn pid(&self) -> Option<i32> {
        self.server.as_ref()?.lock().pid
    }

    /// The cluster's folder (`PGDATA`).
    pub fn pgdata(&self) -> &Path {
        &self.pgdata
    }

    /// Whether this handle started the server (and stops it when dropped).
    pub fn owns_server(&self) -> bool {
        self.server.is_some()
    }

    /// Connection options for `database` on this server.
    pub fn connect_options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new()
            .socket(&self.socket_dir)
            .port(self.port)
            .username(ROLE)
            .database(database)
    }

    /// A `postgres://` URL for `database`, for `psql` and `pgbench`.
    pub fn url(&self, database: &str) -> String {
        self.connect_options(database).to_url_lossy().to_string()
    }

    /// Creates `database` unless it exists.
    pub async fn ensure_database(&self, database: &str) -> anyhow::Result<()> {
        let mut conn = PgConnection::connect_with(&self.connect_options("postgres")).await?;
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
                .bind(database)
                .fetch_one(&mut conn)
                .await?;
        if !exists {
            let sql = format!("CREATE DATABASE {}", quote_ident(database));
            match sqlx::raw_sql(&sql).execute(&mut conn).await {
                Ok(_) => {}
                // Another process created it meanwhile.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P04") => {}
                Err(e) => return Err(e.into()),
            }
        }
        conn.close().await?;
        Ok(())
    }

    /// Fast shutdown (SIGINT): running transactions are rolled back, committed ones are on disk.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let Some(server) = self.server.take() else {
            return;
        };
        match server.stop(libc::SIGINT, Duration::from_secs(30)) {
            true => tracing::info!("embedded PostgreSQL stopped"),
            false => {
                tracing::warn!("embedded PostgreSQL did not stop in 30s; killing it");
                server.stop(libc::SIGKILL, Duration::from_secs(5));
            }
        }
    }

    /// A server already running on `pgdata`, from its `postmaster.pid`
    /// (lines: pid, data folder, start time, port, socket folder, ...).
    fn attach(pgdata: &Path) -> Option<Self> {
        let pidfile = fs::read_to_string(pgdata.join("postmaster.pid")).ok()?;
        let lines: Vec<&str> = pidfile.lines().collect();
        let pid: i32 = lines.first()?.trim().parse().ok()?;
        // SAFETY: signal 0 only checks that the process exists.
        let alive = pid > 0 && unsafe { libc::kill(pid, 0) } == 0;
        let ready = lines.get(7).is_some_and(|s| s.trim() == "ready");
        if !alive || !ready {
            return None;
        }
        Some(EmbeddedPostgres {
            pgdata: pgdata.to_owned(),
            port: lines.get(3)?.trim().parse().ok()?,
            socket_dir: PathBuf::from(lines.get(4)?.trim()),
            server: None,
        })
    }

    /// Waits for `ready` in `postmaster.pid`, which PostgreSQL writes once it accepts
    /// connections (what `pg_ctl -w` waits for).
    fn wait_ready(&mut self, pgdata: &Path, log_path: &Path) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.server.as_ref().and_then(Server::try_exited) {
                self.server = None;
                bail!(
                    "PostgreSQL exited while starting ({}); its log {} ends with:\n{}",
                    status
                        .map(|s| s.to_string())
                        .unwrap_or_else(|e| e.to_string()),
                    log_path.display(),
                    log_tail(log_path)
                );
            }
            let status = fs::read_to_string(pgdata.join("postmaster.pid")).unwrap_or_default();
            if status.lines().nth(7).is_some_and(|s| s.trim() == "ready") {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.shutdown();
                bail!(
                    "PostgreSQL did not accept connections within 60s; see {}",
                    log_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for EmbeddedPostgres {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The cluster's major version, from its `PG_VERSION` (0 if unreadable).
fn major_version(pgdata: &Path) -> u32 {
    let text = fs::read_to_string(pgdata.join("PG_VERSION")).unwrap_or_default();
    text.trim().parse().unwrap_or(0)
}

/// The folder of `initdb` and `postgres`: `pg_config --bindir`, else the newest
/// `/usr/lib/postgresql/<version>/bin` (Debian, Ubuntu), else `initdb` on the `PATH`.
pub fn find_bin_dir() -> anyhow::Result<PathBuf> {
    let has_server = |dir: &Path| dir.join("postgres").is_file() && dir.join("initdb").is_file();
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && has_server(&dir) {
            return Ok(dir);
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            Some((version, e.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Ok(dir);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .find(|dir| has_server(dir))
        .context(
            "no PostgreSQL server binaries found (looked at `pg_config --bindir`, \
             /usr/lib/postgresql/*/bin and PATH): install PostgreSQL (Debian: \
             `apt-get install postgresql`), pass --postgres-bin-dir, or set DATABASE_URL",
        )
}

fn init(
    bin_dir: &Path,
    pgdata: &Path,
    owner: Option<(u32, u32)>,
    options: &Options,
) -> anyhow::Result<()> {
    tracing::info!(pgdata = %pgdata.display(), "initializing the embedded PostgreSQL");
    make_private_dir(pgdata, owner)?;
    let mut cmd = Command::new(bin_dir.join("initdb"));
    cmd.arg("-D")
        .arg(pgdata)
        .args(["-U", ROLE, "--auth=trust", "--encoding=UTF8", "--no-locale"])
        .current_dir("/")
        .stdin(Stdio::null());
    if options.ephemeral {
        cmd.arg("--no-sync");
    }
    run_as(&mut cmd, owner, false);
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", bin_dir.join("initdb").display()))?;
    if !out.status.success() {
        bail!(
            "initdb failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// PostgreSQL refuses to run as root: then it runs as the `postgres` system user.
fn server_user() -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = c"postgres";
    // SAFETY: getpwnam with a NUL-terminated name; the result is read before any other call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!(
            "envlens runs as root and PostgreSQL refuses to: create a `postgres` user \
             (Debian's postgresql package does), run envlens as another user, or set DATABASE_URL"
        );
    }
    // SAFETY: pw is non-null and points to a valid passwd record.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some((uid, gid)))
}

/// Drops to `owner` in the child, and asks the kernel to stop the server when the thread that
/// spawned it dies (after the uid change, which would clear it).
fn run_as(cmd: &mut Command, owner: Option<(u32, u32)>, die_with_parent: bool) {
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if let Some((uid, gid)) = owner {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
            }
            if die_with_parent && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Spawns on a thread that lives as long as the server and its restarts, so that
/// `PR_SET_PDEATHSIG` (which follows the spawning thread, not the process) fires only when
/// envlens itself goes away.
fn spawn_supervised(mut cmd: Command) -> anyhow::Result<Server> {
    let supervision = Arc::new(Supervision {
        state: Mutex::new(Supervised {
            pid: None,
            armed: false,
            stopping: false,
            exited: None,
        }),
        changed: Condvar::new(),
        restarts: Arc::default(),
        on_exit: Mutex::new(None),
    });
    let (started_tx, started_rx) = mpsc::channel();
    let server = Server(supervision.clone());
    std::thread::Builder::new()
        .name("embedded-postgres".into())
        .spawn(move || {
            let child = match cmd.spawn() {
                Ok(child) => child,
                Err(e) => {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            };
            server.lock().pid = Some(child.id() as i32);
            let _ = started_tx.send(Ok(()));
            supervise(&server, cmd, child);
        })?;
    started_rx.recv()?.context("cannot start postgres")?;
    Ok(Server(supervision))
}

/// Waits for the server to exit and starts it again, until envlens stops it.
fn supervise(server: &Server, mut cmd: Command, mut child: Child) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = Instant::now();
        wait_exit_unreaped(&child);
        let mut state = server.lock();
        state.pid = None;
        drop(state);
        let status = child.wait();
        let mut state = server.lock();
        if state.stopping || !state.armed {
            state.exited = Some(status);
            server.0.changed.notify_all();
            return;
        }
        if started.elapsed() >= STABLE_RUN {
            backoff = FIRST_BACKOFF;
        }
        let why = match &status {
            Ok(status) => format!("the embedded PostgreSQL exited ({status})"),
            Err(e) => format!("the embedded PostgreSQL is gone ({e})"),
        };
        tracing::error!(reason = %why, ?backoff, "restarting the embedded PostgreSQL");
        drop(state);
        if let Some(hook) = &*server.0.on_exit.lock().unwrap_or_else(|e| e.into_inner()) {
            hook(&why);
        }
        loop {
            let state = server.lock();
            let (mut state, _) = server
                .0
                .changed
                .wait_timeout_while(state, backoff, |s| !s.stopping)
                .unwrap_or_else(|e| e.into_inner());
            if state.stopping {
                state.exited = Some(status);
                server.0.changed.notify_all();
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            server.0.restarts.fetch_add(1, Ordering::Relaxed);
            match cmd.spawn() {
                Ok(started) => {
                    state.pid = Some(started.id() as i32);
                    tracing::info!(pid = started.id(), "embedded PostgreSQL started again");
                    child = started;
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, ?backoff, "cannot start the embedded PostgreSQL")
                }
            }
        }
    }
}

/// Blocks until `child` has exited, leaving it a zombie: its pid stays ours until reaped.
fn wait_exit_unreaped(child: &Child) {
    loop {
        // SAFETY: waitid on our own child with a zeroed siginfo to fill.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOWAIT;
        let rc = unsafe { libc::waitid(libc::P_PID, child.id(), &mut info, flags) };
        if rc == 0 || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Where the cluster lives: in the data folder, unless envlens runs as root and the server's
/// user cannot reach it (a folder under `/root`, or a private temporary one). Then it lives
/// in `/var/lib/envlens/<hash of the data folder>`, the same on every start.
fn cluster_dir(data_dir: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<PathBuf> {
    let Some((uid, gid)) = owner else {
        return Ok(data_dir.to_owned());
    };
    if reachable(data_dir, uid, gid) {
        return Ok(data_dir.to_owned());
    }
    let dir = Path::new(FALLBACK_DIR).join(format!("{:016x}", path_hash(data_dir)));
    tracing::warn!(
        data_dir = %data_dir.display(),
        cluster = %dir.display(),
        "the postgres user cannot reach the data folder; the database lives elsewhere \
         (make the folder's parents searchable, e.g. chmod o+x, to keep it inside)"
    );
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)?;
    Ok(dir)
}

const FALLBACK_DIR: &str = "/var/lib/envlens";

/// Whether `uid` (in group `gid`) may search every folder from `/` down to `path`.
fn reachable(path: &Path, uid: u32, gid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    path.ancestors().all(|dir| match fs::metadata(dir) {
        Ok(m) => {
            let mode = m.mode();
            if m.uid() == uid {
                mode & 0o100 != 0
            } else if m.gid() == gid {
                mode & 0o010 != 0
            } else {
                mode & 0o001 != 0
            }
        }
        Err(_) => false,
    })
}

fn path_hash(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish()
}

fn socket_dir(data_dir: &Path) -> anyhow::Result<PathBuf> {
    let dir = data_dir.join("run");
    if dir.as_os_str().len() <= MAX_SOCKET_DIR_LEN {
        return Ok(dir);
    }
    // A deep data folder: the socket goes to a short private folder named after it.
    Ok(std::env::temp_dir().join(format!("envlens-{:016x}", path_hash(data_dir))))
}

fn make_private_dir(dir: &Path, owner: Option<(u32, u32)>) -> anyhow::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
    if let Some((uid, gid)) = owner {
        chown(dir, Some(uid), Some(gid))?;
    }
    Ok(())
}

fn log_tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
