//! Command line and settings: every setting is a flag and an environment variable (the flag wins).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "envlens", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written to stderr.
    #[arg(
        long,
        global = true,
        env = "ENVLENS_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    pub log_format: LogFormat,
    /// Export traces over OTLP/HTTP (protobuf) to this URL, e.g.
    /// `http://collector:4318/v1/traces`. Without it, no exporter runs.
    #[arg(long, global = true, env = "ENVLENS_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// How log lines are written (`--log-format`, `ENVLENS_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One readable line per event, the span's fields before the message.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `fields.message`, the event's own
    /// fields, and `span` / `spans` with the request's fields.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API (starts the embedded PostgreSQL when no database URL is given).
    Serve(ServeArgs),
    /// Apply the database migrations and exit.
    Migrate(DatabaseArgs),
    /// Mint a session token for a mirrored user (or an internal token, as GitLab signs its
    /// requests), for trying the API.
    Token(TokenArgs),
    /// The identity mirror: `envlens identity import <file>`.
    #[command(subcommand)]
    Identity(IdentityCommand),
    /// Print the GraphQL schema (SDL), as committed in `schema.graphql`.
    PrintSchema,
    /// Print the health of the Kubernetes objects in manifests (YAML or JSON), as the service
    /// judges a live environment's, e.g. `kubectl get deploy -o yaml | envlens health -`.
    Health(HealthArgs),
    /// Serve the dashboard over a sample GitLab and a sample cluster that changes by itself,
    /// with its own data folder; prints how to sign in.
    Demo(DemoArgs),
    /// What a deployment changed in its cluster (SPEC 10), from the snapshots in the database:
    /// `envlens history --deployment 101`, or `--project group/app --environment production
    /// [--iid 7]` (the newest successful deployment without an iid).
    History(HistoryArgs),
    /// Read groups, projects, users, memberships, agents with their configuration and
    /// environments from GitLab's API once (`gitlab:` of the configuration file), and report.
    Sync(SyncArgs),
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// The demo's own data folder: its embedded PostgreSQL and secrets.
    #[arg(long, default_value = ".envlens-demo")]
    pub data_dir: PathBuf,
    /// PostgreSQL to use instead of the embedded one (a database for the demo alone).
    #[arg(long, hide_env_values = true)]
    pub database_url: Option<String>,
    /// Folder of the PostgreSQL server binaries; found when not given.
    #[arg(long, env = "ENVLENS_POSTGRES_BIN_DIR")]
    pub postgres_bin_dir: Option<PathBuf>,
    #[command(flatten)]
    pub limits: Limits,
}

#[derive(Debug, Clone, Args)]
pub struct HistoryArgs {
    /// The deployment's id (GitLab's global id `gid://gitlab/Deployment/<id>` also works).
    #[arg(long, conflicts_with_all = ["project", "environment", "iid"])]
    pub deployment: Option<String>,
    /// The project's full path, with `--environment`.
    #[arg(long, requires = "environment")]
    pub project: Option<String>,
    /// The environment's name, with `--project`.
    #[arg(long, requires = "project")]
    pub environment: Option<String>,
    /// The deployment's iid in the project; by default its newest successful deployment.
    #[arg(long, requires = "project")]
    pub iid: Option<i64>,
    /// Compare with this deployment (id) instead of the previous one with a snapshot.
    #[arg(long)]
    pub since: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value = "text")]
    pub output: HistoryFormat,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum HistoryFormat {
    /// Lines for people: the images, then what was added, removed and modified.
    Text,
    /// One JSON object, the shape of GraphQL's `changes` with each resource's identity.
    Json,
}

#[derive(Debug, Clone, Args)]
pub struct SyncArgs {
    /// The configuration file naming GitLab (`gitlab.url`, `gitlab.token_file`, `gitlab.groups`).
    #[arg(long, env = "ENVLENS_CONFIG")]
    pub config: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// When another envlens (a `serve`) is running a pass on the database, fail at once
    /// (exit 1) instead of waiting for it and then running one.
    #[arg(long)]
    pub no_wait: bool,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// Where the data lives: the data folder, and the database unless one is named.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// Folder for generated secrets and the embedded PostgreSQL.
    #[arg(long, env = "ENVLENS_DATA_DIR", default_value = ".envlens")]
    pub data_dir: PathBuf,
    /// PostgreSQL to use instead of the embedded one, e.g. `postgres://user:pass@host/envlens`.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Folder of the PostgreSQL server binaries for the embedded database; found when not given.
    #[arg(long, env = "ENVLENS_POSTGRES_BIN_DIR")]
    pub postgres_bin_dir: Option<PathBuf>,
    /// Connections in the pool; by default twice the cores plus one (at least 4): more
    /// backends than the cores can run only lengthen the queue inside PostgreSQL. GraphQL
    /// requests have as many again, of their own (`db::lease`).
    #[arg(long, env = "ENVLENS_DATABASE_MAX_CONNECTIONS", default_value_t = default_pool_size())]
    pub database_max_connections: u32,
    /// How long a request waits for a database connection before it is answered 503.
    #[arg(long, env = "ENVLENS_DATABASE_ACQUIRE_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub database_acquire_timeout: Duration,
}

#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// Base64 of the 32-byte key GitLab signs internal requests with (`Gitlab-Envlens-Api-Request`).
    #[arg(long, env = "ENVLENS_INTERNAL_SECRET_FILE")]
    pub internal_secret_file: Option<PathBuf>,
    /// Base64 of the 32-byte key GitLab signs user sessions with (`_gitlab_kas` cookie, bearer tokens).
    #[arg(long, env = "ENVLENS_SESSION_SECRET_FILE")]
    pub session_secret_file: Option<PathBuf>,
    /// The token GitLab sends in `X-Gitlab-Token` with system and deployment hooks.
    #[arg(long, env = "ENVLENS_WEBHOOK_TOKEN_FILE")]
    pub webhook_token_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "ENVLENS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Connections deployment creations may hold at once, apart from the pool: a creation's
    /// commit waits for the disk with its connection held, and PostgreSQL flushes the commits
    /// that wait together, so more than the cores pay (`db::lease::WRITE_CONNECTIONS`).
    /// Opened only while that many creations run at once.
    #[arg(long, env = "ENVLENS_DATABASE_WRITE_CONNECTIONS", default_value_t = crate::db::lease::WRITE_CONNECTIONS)]
    pub database_write_connections: u32,
    #[command(flatten)]
    pub secrets: SecretArgs,
    #[command(flatten)]
    pub limits: Limits,
    /// YAML file of cluster connections per agent, proxy timeouts and CORS origins (see README).
    #[arg(long, env = "ENVLENS_CONFIG")]
    pub config: Option<PathBuf>,
    /// The address users and jobs reach envlens at, e.g. `https://envlens.example.com`: the
    /// audience of CI/CD ID tokens, the dashboard's links and redirects; its cookies are
    /// `Secure` when it is https. Default: `http://<listen address>`.
    #[arg(long, env = "ENVLENS_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// How long a dashboard session lasts after signing in (1m to 7d).
    #[arg(long, env = "ENVLENS_SESSION_LIFETIME", default_value = "12h", value_parser = parse_duration)]
    pub session_lifetime: Duration,
    #[command(flatten)]
    pub replicas: ReplicaArgs,
}

/// Replicas that share the clusters (SPEC 16).
#[derive(Debug, Clone, Args)]
pub struct ReplicaArgs {
    /// The address other replicas reach this one's internal listener at, e.g.
    /// `http://10.0.0.7:8081`. Default: in a pod (`POD_IP` set) `http://<POD_IP>:<internal
    /// port>`, else the internal listener's own address.
    #[arg(long, env = "ENVLENS_ADVERTISE_URL", value_parser = parse_advertise_url)]
    pub advertise_url: Option<String>,
    /// Address of the internal listener, for other replicas only. Default: in a pod
    /// `0.0.0.0:8081`, else a free port on 127.0.0.1.
    #[arg(long, env = "ENVLENS_INTERNAL_LISTEN")]
    pub internal_listen: Option<SocketAddr>,
    /// A replica whose heartbeat is older than this is dead, and its connections go to the
    /// others (1s to 10m); also the length of each connection's lease.
    #[arg(long, env = "ENVLENS_REPLICA_WINDOW", default_value = "10s", value_parser = parse_replica_window)]
    pub replica_window: Duration,
    /// Share the clusters with the other replicas: each connection is watched by one replica
    /// alone, its lease holder (SPEC 16). Off by default until views and subscriptions are
    /// routed to the owner: without routing, a replica that does not own a connection lists
    /// it fresh for each view and its subscriptions get no changes, so every replica watches
    /// every connection (as before replicas were known).
    #[arg(long, env = "ENVLENS_SHARE_CLUSTERS")]
    pub share_clusters: bool,
}

/// An `--advertise-url`: an http(s) URL with a host (and a port), nothing after it.
fn parse_advertise_url(url: &str) -> Result<String, String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("`{url}`: the advertise URL must start with http:// or https://"))?;
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
        return Err(format!(
            "`{url}`: the advertise URL is a scheme, a host and a port, e.g. http://10.0.0.7:8081"
        ));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

fn parse_replica_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&d) {
        return Err(format!("`{s}`: the replica window is between 1s and 10m"));
    }
    Ok(d)
}

#[derive(Debug, Clone, Args)]
#[command(group(clap::ArgGroup::new("kind").required(true).args(["user", "internal"])))]
pub struct TokenArgs {
    /// Username of a user in the identity mirror: a session token, as GitLab mints for a
    /// signed-in user.
    #[arg(long)]
    pub user: Option<String>,
    /// An internal token (`Gitlab-Envlens-Api-Request`), as GitLab signs its requests to
    /// `/api/v4/internal/...`; valid for five minutes at most.
    #[arg(long)]
    pub internal: bool,
    /// How long the token is valid (at most a day; five minutes for an internal token).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Print a one-time link that signs the user in to the dashboard (valid five minutes)
    /// instead of a token.
    #[arg(long, requires = "user")]
    pub sign_in: bool,
    /// The address users reach envlens at, as `serve` has it: the link's start.
    /// Default: `http://<listen address>`.
    #[arg(long, env = "ENVLENS_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// The address `serve` listens on, for the default of `--public-url`.
    #[arg(long, env = "ENVLENS_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    #[command(flatten)]
    pub database: DatabaseArgs,
    #[command(flatten)]
    pub secrets: SecretArgs,
}

#[derive(Debug, Clone, Subcommand)]
pub enum IdentityCommand {
    /// Upsert groups, projects, users and members from a file in the format of
    /// `PUT /api/v4/internal/identity` (e.g. `examples/identity.json`; `-` reads standard
    /// input), in one transaction, into the database `serve` uses.
    Import(ImportArgs),
}

#[derive(Debug, Clone, Args)]
pub struct ImportArgs {
    /// The snapshot: `{"groups": [...], "projects": [...], "users": [...], "members": [...]}`.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// Output format.
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: OutputFormat,
    /// A folder of Lua health scripts laid out as Argo CD's `resource_customizations`
    /// (`<group>/<Kind>/health.lua`); a script replaces the built-in rule of its kind.
    #[arg(long, value_name = "FOLDER")]
    pub customizations: Option<PathBuf>,
    /// Manifest files: several documents each, `---` between them; `-` (or none) reads standard input.
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

/// Request limits, shared by every API route.
#[derive(Debug, Clone, Copy, Args)]
pub struct Limits {
    /// Largest accepted request body, in bytes; larger ones get 413.
    #[arg(long, env = "ENVLENS_BODY_LIMIT", default_value_t = 1024 * 1024)]
    pub body_limit: usize,
    /// Longest a non-streaming request may take before it is answered 503.
    #[arg(long, env = "ENVLENS_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,
    /// How long shutdown waits for requests in flight.
    #[arg(long, env = "ENVLENS_SHUTDOWN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,
    #[command(flatten)]
    pub connections: ConnectionLimits,
}

/// What one client may hold of the server (`http::server`).
#[derive(Debug, Clone, Copy, Args)]
pub struct ConnectionLimits {
    /// How long a client has to send a whole request head, from its first byte (from the
    /// opening, for a new connection); slower connections are closed.
    #[arg(long, env = "ENVLENS_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a keep-alive connection may wait for its next request; keep it above the idle
    /// timeout of a load balancer in front.
    #[arg(long, env = "ENVLENS_IDLE_TIMEOUT", default_value = "75s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Connections served at once; more are closed at once (and counted), except those the
    /// reserve admits. Kept below the open-files limit.
    #[arg(long, env = "ENVLENS_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,
    /// Connections admitted beyond the cap for one request each to `/-/liveness`,
    /// `/-/readiness`, `/metrics` and `/api/v4/internal/`, so that probes and GitLab still get
    /// answers when the cap is reached.
    #[arg(long, env = "ENVLENS_RESERVED_CONNECTIONS", default_value_t = 32)]
    pub reserved_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(75),
            max_connections: 4096,
            reserved_connections: 32,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            body_limit: 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(30),
            connections: ConnectionLimits::default(),
        }
    }
}

fn default_pool_size() -> u32 {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get() as u32);
    (2 * cores + 1).max(4)
}

/// `250ms`, `3s`, `5m`, `1h`, `1d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("`{s}` is not a duration like 30s, 5m or 250ms"))?;
    let seconds_per = match unit {
        "ms" => return Ok(Duration::from_millis(n)),
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86400,
        _ => {
            return Err(format!(
                "`{s}`: unknown unit `{unit}` (use ms, s, m, h or d)"
            ))
        }
    };
    // Checked: a product past 64 bits would wrap to a short duration.
    n.checked_mul(seconds_per)
        .map(Duration::from_secs)
        .ok_or_else(|| format!("`{s}` is too long a duration"))
}

/// How `envlens health` prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns with a header, like kubectl.
    Table,
    /// A JSON array of `{apiVersion, kind, namespace, name, health}`.
    Json,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_urls_and_replica_windows_are_checked() {
        assert_eq!(
            parse_advertise_url("https://envlens-1.envlens:8081/").unwrap(),
            "https://envlens-1.envlens:8081"
        );
        assert!(parse_advertise_url("http://10.0.0.7:8081").is_ok());
        for bad in [
            "10.0.0.7:8081",
            "ftp://x",
            "http://",
            "http://x/path",
            "http://u@x",
        ] {
            assert!(parse_advertise_url(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_replica_window("3s"), Ok(Duration::from_secs(3)));
        assert!(parse_replica_window("500ms").is_err());
        assert!(parse_replica_window("1h").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5 weeks").is_err());
        assert!(parse_duration("s").is_err());
    }

    /// Found while writing the fuzz target `config_yaml` (docs/fuzzing.md): a number of minutes,
    /// hours or days whose seconds do not fit in 64 bits overflowed (a panic with overflow checks, a short
    /// duration after wrapping without them) instead of being refused.
    #[test]
    fn a_duration_too_long_to_count_is_refused() {
        for text in [
            "307445734561825861m",
            "5124095576030432h",
            "213503982334602d",
        ] {
            let refused = parse_duration(text).unwrap_err();
            assert!(refused.contains("too long"), "{text}: {refused}");
        }
        assert_eq!(
            parse_duration("213503982334601d"),
            Ok(Duration::from_secs(213_503_982_334_601 * 86_400))
        );
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
