//! The subcommands: `serve`, `migrate`, `token`, `identity import`, `print-schema`, `health`,
//! `demo`, `history`, `sync`.

pub mod health;
pub mod history;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::auth::secrets::Secrets;
use crate::auth::{mint_internal, mint_session, Keys};
use crate::config::file::Settings;
use crate::config::{
    Command, DatabaseArgs, HealthArgs, IdentityCommand, ImportArgs, ServeArgs, SyncArgs, TokenArgs,
};
use crate::db::{self, Database};
use crate::k8s::clusters::Clusters;
use crate::resources::health::Customizations;
use crate::state::AppState;

/// How often the health keeper looks for environments bound to an agent (a new deployment's
/// group is kept from its next round on; a kept group's changes are followed at once).
const KEEPER_ROUND: std::time::Duration = std::time::Duration::from_secs(10);
/// How much longer than the cluster's response timeout a view forwarded to its owner may take.
const FORWARD_MARGIN: std::time::Duration = std::time::Duration::from_secs(5);

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Migrate(args) => migrate(args).await,
        Command::Token(args) => token(args).await,
        Command::Identity(IdentityCommand::Import(args)) => import_identity(args).await,
        Command::PrintSchema => {
            print!("{}", crate::graphql::sdl());
            Ok(())
        }
        Command::Health(args) => health_command(args),
        Command::Demo(args) => crate::demo::run(args, shutdown_signal()).await,
        Command::History(args) => history_command(args).await,
        Command::Sync(args) => sync(args).await,
    }
}

/// Prints a deployment's changes; fails (exit 1) when it has none to show, saying why.
async fn history_command(args: crate::config::HistoryArgs) -> anyhow::Result<()> {
    let database = Database::open(&args.database).await?;
    let changes = match database.pool.pg().acquire().await {
        Ok(mut conn) => history::changes(&mut conn, &args).await,
        Err(e) => Err(e.into()),
    };
    database.close().await;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    history::print(&changes?, args.output, &mut out)?;
    std::io::Write::flush(&mut out)?;
    Ok(())
}

/// `envlens sync`: one pass, its steps on stderr as they go, the report at the end. Beside a
/// `serve` whose pass is running, it waits for that one (showing its steps), unless
/// `--no-wait`.
async fn sync(args: SyncArgs) -> anyhow::Result<()> {
    let settings = Settings::load(&args.config)?;
    let gitlab = settings
        .gitlab
        .as_ref()
        .context("the configuration file names no GitLab (gitlab.url, gitlab.token_file)")?;
    let metrics = std::sync::Arc::new(crate::telemetry::Metrics::default());
    let api = crate::gitlab::Instance::load(gitlab, "", metrics.clone())?.api;
    let database = Database::open(&args.database).await?;
    let started = std::time::Instant::now();
    let mut progress = |step: &str| {
        eprintln!("[{:>6.1} s] {step}", started.elapsed().as_secs_f64());
    };
    let scope = crate::ingest::sync::Scope::of(gitlab);
    let db = database.pool.pg();
    let report = if args.no_wait {
        crate::ingest::sync::pass(db, &api, &scope, &metrics, &mut progress).await
    } else {
        crate::ingest::sync::pass_after_running(db, &api, &scope, &metrics, &mut progress).await
    };
    database.close().await;
    let report = report.map_err(|e| anyhow::anyhow!("sync failed, nothing written: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("synced: {report}");
    }
    Ok(())
}

/// The follower of Flux-bound environments (SPEC 15): with a GitLab token, a recorded
/// deployment's creation in GitLab is tried at once (and again by the follow-ups' worker).
fn pull_watcher(state: &AppState) -> crate::pull::Watcher {
    let tell = state
        .gitlab
        .as_ref()
        .filter(|g| g.api.has_token())
        .map(|gitlab| {
            let worker = crate::ingest::followups::Worker::new(
                state.db.pg().clone(),
                gitlab.api.clone(),
                state.metrics.clone(),
            );
            std::sync::Arc::new(move |id: i64| {
                let worker = worker.clone();
                tokio::spawn(async move { worker.try_now(id).await });
            }) as crate::pull::OnRecorded
        });
    crate::pull::Watcher::new(state.db.pg().clone(), state.clusters.clone(), tell)
}

/// `serve`'s work with GitLab's API: the follow-ups of hooks, and a sync pass every
/// `gitlab.sync_interval` (the first one at start).
fn gitlab_tasks(
    state: &AppState,
    settings: &crate::config::file::GitLabSettings,
) -> Vec<tokio::task::JoinHandle<()>> {
    let Some(gitlab) = state.gitlab.as_ref().filter(|g| g.api.has_token()) else {
        return Vec::new();
    };
    let worker = crate::ingest::followups::Worker::new(
        state.db.pg().clone(),
        gitlab.api.clone(),
        state.metrics.clone(),
    );
    let mut tasks = vec![tokio::spawn(
        worker.run_forever(std::time::Duration::from_secs(10)),
    )];
    if !settings.sync_interval.is_zero() {
        let (db, api, metrics) = (
            state.db.pg().clone(),
            gitlab.api.clone(),
            state.metrics.clone(),
        );
        let scope = crate::ingest::sync::Scope::of(settings);
        let every = settings.sync_interval;
        tasks.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let mut progress = |step: &str| tracing::debug!(step, "sync");
                match crate::ingest::sync::pass(&db, &api, &scope, &metrics, &mut progress).await {
                    Ok(report) => tracing::info!(%report, "GitLab sync pass complete"),
                    Err(e @ crate::ingest::sync::Failed::Busy) => tracing::info!(%e),
                    Err(e) => {
                        tracing::warn!(error = %e, "GitLab sync pass failed: nothing written")
                    }
                }
            }
        }));
    }
    tasks
}

/// Prints what it could read, then fails (exit 1) if any file or document could not be read.
fn health_command(args: HealthArgs) -> anyhow::Result<()> {
    let custom = Customizations::load(args.customizations.as_deref(), &Default::default())?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let failures = crate::cli::health::run(
        &args.files,
        args.output,
        &custom,
        &mut std::io::stdin().lock(),
        &mut out,
        &mut std::io::stderr().lock(),
    )?;
    match failures {
        0 => Ok(()),
        1 => anyhow::bail!("1 file or document could not be read"),
        n => anyhow::bail!("{n} files or documents could not be read"),
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // A bad configuration file stops envlens before anything starts.
    let settings = match &args.config {
        Some(path) => Settings::load(path)?,
        None => Settings::default(),
    };
    let metrics = std::sync::Arc::new(crate::telemetry::Metrics::default());
    // With --share-clusters, each connection's watches run only while this replica holds its
    // lease (SPEC 16); else always.
    let fences = if args.replicas.share_clusters {
        crate::k8s::watch::fence::Fences::shared()
    } else {
        crate::k8s::watch::fence::Fences::solo()
    };
    let mut clusters =
        Clusters::load_fenced(&settings.kubernetes, metrics.clone(), fences.clone()).await?;
    // GitLab's agent server (SPEC 14): says where it is, or why it cannot be used.
    if let Some(gitlab) = &settings.gitlab {
        if let Some(kas) = crate::k8s::kas::Kas::start(gitlab, metrics).await? {
            clusters = clusters.with_kas(kas);
        }
    }
    // A script that does not compile is logged here, naming it; only its kind is Unknown.
    let health = Customizations::load(
        settings.health.customizations.as_deref(),
        &settings.health.scripts,
    )?;
    let secrets = Secrets::load(&args.secrets, &args.database.data_dir)?;
    for path in &secrets.generated {
        let path = path.display().to_string();
        crate::telemetry::announce(
            tracing::Level::INFO,
            &format!("generated secret {path}"),
            &[("path", &path)],
        );
    }
    let database = Database::open(&args.database).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let pod_ip = std::env::var("POD_IP").ok().filter(|ip| !ip.is_empty());
    let internal_addr =
        crate::replicas::internal_listen(args.replicas.internal_listen, pod_ip.as_deref());
    let internal = TcpListener::bind(internal_addr)
        .await
        .with_context(|| format!("cannot listen on {internal_addr} (--internal-listen)"))?;
    let internal_addr = internal.local_addr()?;
    // The leases' own connections: at 1,000 agents, renewals queued behind the health
    // keeper's writes in the shared pool past the window, and held leases lapsed.
    let ownership = crate::replicas::Ownership::new(
        database.side_pool(2, args.database.database_acquire_timeout),
        fences,
        crate::replicas::advertise_url(
            args.replicas.advertise_url.as_deref(),
            pod_ip.as_deref(),
            internal_addr,
        ),
        args.replicas.replica_window,
    );
    let public_url = args
        .public_url
        .clone()
        .unwrap_or_else(|| format!("http://{addr}"));
    let mut site = crate::web::Site::new(&public_url, args.session_lifetime)?;
    let keys = Keys::new(secrets).with_group_webhooks(group_webhooks(&settings)?)?;
    let mut state = AppState::new(database.pool.clone(), keys, args.limits)
        .with_write_connections(args.database_write_connections)
        .with_clusters(clusters, settings.cors)
        .with_trusted_proxies(crate::http::client_address::TrustedProxies::new(
            settings.trusted_proxies.clone(),
        ))
        .with_health(health)
        .with_per_user(settings.per_user);
    if let Some(gitlab) = &settings.gitlab {
        let instance = crate::gitlab::Instance::load(gitlab, &public_url, state.metrics.clone())?;
        if let Some(oidc) = sign_in_with_gitlab(gitlab, &instance.api)? {
            site = site.with_gitlab(oidc);
        }
        state = state.with_gitlab(instance);
    }
    let mut state = state.with_site(site);
    if args.replicas.share_clusters {
        // A view of a connection another replica owns is answered through it; the owner
        // bounds its own reading of the cluster by the response timeout.
        let forward = crate::replicas::forward::Forward::new(
            ownership.clone(),
            state.keys.clone(),
            state.clusters.response_timeout + FORWARD_MARGIN,
        )?;
        state = state.with_forward(forward);
    }
    report_unconnected_agents(&state).await;
    database.register_metrics(&state.metrics);
    state.live.relay_notices();
    let pruning = tokio::spawn(prune_deliveries(
        state.db.clone(),
        settings.history.events_keep,
    ));
    let history = tokio::spawn(
        crate::history::worker::Worker::new(
            state.db.pg().clone(),
            state.clusters.clone(),
            state.health.clone(),
            settings.history.clone(),
        )
        .run(),
    );
    let pulls = tokio::spawn(pull_watcher(&state).run(std::time::Duration::from_secs(5)));
    let keeper = tokio::spawn(
        crate::graphql::HealthKeeper::new(
            &state.db,
            state.clusters.clone(),
            state.health.clone(),
            &state.live,
            settings.kubernetes.health_budget_objects,
            KEEPER_ROUND,
        )
        .run(),
    );
    let gitlab_work = match &settings.gitlab {
        Some(gitlab) => gitlab_tasks(&state, gitlab),
        None => Vec::new(),
    };
    ownership
        .join()
        .await
        .context("cannot register this replica in the database")?;
    let coordinating = tokio::spawn(ownership.clone().run());
    let internal_app = crate::replicas::internal::router(crate::replicas::internal::Internal {
        keys: state.keys.clone(),
        ownership: ownership.clone(),
        db: state.db.clone(),
        gitlab: state.gitlab.clone(),
        clusters: state.clusters.clone(),
        health: state.health.clone(),
        encodings: Default::default(),
    });
    // Bounded as the public listener is (heads, idle connections, a cap): in a pod it listens
    // on every address, and only the chart's NetworkPolicy keeps other pods from it.
    let internal_serving = tokio::spawn(crate::http::server::serve(
        internal,
        crate::http::server::Listener::Internal,
        internal_app,
        state.limits.connections,
        state.metrics.clone(),
        std::future::pending(),
    ));
    crate::telemetry::announce(
        tracing::Level::INFO,
        &format!(
            "envlens listening on http://{addr}; GraphQL explorer at http://{addr}/-/graphql-explorer"
        ),
        &[("address", &addr.to_string())],
    );
    // After the line above: tools that take the first address they see take the public one.
    crate::telemetry::announce(
        tracing::Level::INFO,
        &format!(
            "replica {} advertised at {}; internal listener on {internal_addr}",
            ownership.id, ownership.advertise_url
        ),
        &[
            ("replica", &ownership.id),
            ("advertise_url", &ownership.advertise_url),
        ],
    );
    crate::run(
        state,
        listener,
        shutdown_signal(),
        args.limits.shutdown_timeout,
    )
    .await?;
    coordinating.abort();
    ownership.leave().await;
    internal_serving.abort();
    pruning.abort();
    history.abort();
    pulls.abort();
    keeper.abort();
    for task in gitlab_work {
        task.abort();
    }
    database.close().await;
    tracing::info!("stopped");
    Ok(())
}

/// Logs the registered agents that have no cluster connection (SPEC 6), so that an operator
/// who upgraded from the old default connection sees at once which entries to add.
async fn report_unconnected_agents(state: &AppState) {
    const SHOWN: usize = 20;
    let agents = match crate::db::agents::all(state.db.pg(), 100_000).await {
        Ok(agents) => agents,
        Err(e) => {
            return tracing::warn!(error = %e, "cannot list the agents to check their connections")
        }
    };
    let unconnected: Vec<String> = agents
        .iter()
        .filter(|a| {
            !state
                .clusters
                .has_entry(a.id, &a.project_full_path, &a.name)
        })
        .map(|a| format!("{} ({}:{})", a.id, a.project_full_path, a.name))
        .collect();
    if !unconnected.is_empty() && state.clusters.kas().is_some() {
        tracing::info!(
            count = unconnected.len(),
            "agents without a kubernetes.agents entry are reached through GitLab's agent server"
        );
    } else if !unconnected.is_empty() {
        let more = unconnected.len().saturating_sub(SHOWN);
        tracing::warn!(
            count = unconnected.len(),
            agents = %unconnected[..unconnected.len().min(SHOWN)].join(", "),
            more,
            "agents without a cluster connection: their views answer 503 until kubernetes.agents \
             names them (a context, or in_cluster: true), or gitlab.kas is configured"
        );
    }
}

/// The group webhooks' tokens of `gitlab.webhooks` (SPEC 13), read from their files.
pub fn group_webhooks(settings: &Settings) -> anyhow::Result<Vec<crate::auth::GroupToken>> {
    let hooks = settings.gitlab.iter().flat_map(|g| &g.webhooks);
    hooks
        .map(|h| {
            crate::auth::GroupToken::load(&h.group, &h.token_file)
                .with_context(|| format!("gitlab.webhooks: group {}", h.group))
        })
        .collect()
}

/// "Sign in with GitLab", when `gitlab.client_id` names an OAuth application.
fn sign_in_with_gitlab(
    settings: &crate::config::file::GitLabSettings,
    api: &crate::gitlab::api::GitLab,
) -> anyhow::Result<Option<crate::gitlab::oidc::Oidc>> {
    let Some(client_id) = &settings.client_id else {
        anyhow::ensure!(
            settings.client_secret_file.is_none(),
            "gitlab.client_secret_file is set without gitlab.client_id"
        );
        return Ok(None);
    };
    let secret = match &settings.client_secret_file {
        Some(path) => Some(std::fs::read_to_string(path).with_context(|| {
            format!("cannot read gitlab.client_secret_file {}", path.display())
        })?),
        None => None,
    };
    Ok(Some(crate::gitlab::oidc::Oidc::new(
        api.clone(),
        client_id.trim(),
        secret.as_deref(),
    )))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let terminate = async {
        match term.as_mut() {
            Some(term) => {
                term.recv().await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("shutting down: finishing the requests in flight");
}

/// Forgets webhook deliveries older than a week, and expired dashboard sessions, sign-in links
/// and sign-in attempts, and finished GitLab follow-ups, hourly.
async fn prune_deliveries(pool: db::pool::Pool, events_keep: std::time::Duration) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        every.tick().await;
        if let Err(e) = db::deliveries::prune(pool.pg(), 7).await {
            tracing::warn!(error = %e, "cannot prune webhook deliveries");
        }
        if let Err(e) = db::sessions::prune(pool.pg()).await {
            tracing::warn!(error = %e, "cannot prune expired sessions");
        }
        if let Err(e) = db::followups::prune(pool.pg(), 7).await {
            tracing::warn!(error = %e, "cannot prune finished GitLab follow-ups");
        }
        // `history.events_keep`: envlens' own events of the environments' timelines.
        let before = chrono::Duration::from_std(events_keep)
            .ok()
            .and_then(|keep| chrono::Utc::now().checked_sub_signed(keep));
        if let Some(before) = before {
            if let Err(e) = db::events::prune(pool.pg(), before).await {
                tracing::warn!(error = %e, "cannot prune the timelines' events");
            }
        }
    }
}

async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    let database = Database::open(&args).await?;
    let applied = db::MIGRATOR.iter().count();
    println!("database is at migration {applied}");
    database.close().await;
    Ok(())
}

async fn token(args: TokenArgs) -> anyhow::Result<()> {
    let Some(username) = &args.user else {
        let secrets = Secrets::load(&args.secrets, &args.database.data_dir)?;
        println!("{}", mint_internal(secrets.internal.bytes(), args.ttl)?);
        eprintln!(
            "internal token: send it as the header `Gitlab-Envlens-Api-Request: <token>` \
             to /api/v4/internal/...; it is valid for five minutes at most"
        );
        return Ok(());
    };
    let database = Database::open(&args.database).await?;
    let user = db::identity::find_user_by_username(database.pool.pg(), username).await;
    let user = match user {
        Ok(Some(user)) => user,
        other => {
            database.close().await;
            return Err(other.err().map(anyhow::Error::from).unwrap_or_else(|| {
                anyhow::anyhow!(
                    "no user `{username}` in the identity mirror: GitLab's system hooks or its \
                     bulk snapshot fill it; to try envlens without GitLab, \
                     `envlens identity import examples/identity.json`"
                )
            }));
        }
    };
    if args.sign_in {
        let public_url = args
            .public_url
            .clone()
            .unwrap_or_else(|| format!("http://{}", args.listen));
        // Checked as `serve` checks it, so that the link leads where `serve` answers.
        crate::web::Site::new(&public_url, crate::web::DEFAULT_SESSION_LIFETIME)?;
        let link = crate::web::sign_in::create_link(&database.pool, &public_url, user.id).await;
        database.close().await;
        println!("{}", link?);
        eprintln!(
            "sign-in link for {} (id {}): open it in a browser within five minutes and press \
             \"Continue as {}\"; it works once (opening it spends nothing: a link preview does not)",
            user.username, user.id, user.username
        );
        return Ok(());
    }
    database.close().await;
    let secrets = Secrets::load(&args.secrets, &args.database.data_dir)?;
    let (token, csrf) = mint_session(secrets.session.bytes(), user.id, &user.username, args.ttl)?;
    println!("{token}");
    eprintln!(
        "session token for {} (id {}): send it as `Authorization: Bearer <token>`, or as the \
         `_gitlab_kas` cookie with the header `X-Csrf-Token: {csrf}`",
        user.username, user.id
    );
    Ok(())
}

/// Applies a snapshot file through the same code as `PUT /api/v4/internal/identity`, in the
/// database `serve` uses (attaching to its embedded PostgreSQL, or starting it).
async fn import_identity(args: ImportArgs) -> anyhow::Result<()> {
    let bytes = if args.file.as_os_str() == "-" {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut bytes)?;
        bytes
    } else {
        std::fs::read(&args.file).with_context(|| format!("cannot read {}", args.file.display()))?
    };
    let name = args.file.display();
    let snapshot = crate::http::extract::parse(&bytes)
        .map_err(|e| anyhow::anyhow!("{name}: {}", field_error(&e)))?;
    let database = Database::open(&args.database).await?;
    let imported = crate::ingest::identity::import(database.pool.pg(), snapshot).await;
    database.close().await;
    let counts = imported.map_err(|e| anyhow::anyhow!("{name}: {}", field_error(&e)))?;
    println!(
        "imported {name}: {} groups, {} projects, {} users, {} members",
        counts["groups"], counts["projects"], counts["users"], counts["members"]
    );
    Ok(())
}

/// An error as the API would name it: the field at fault first.
fn field_error(e: &crate::error::Error) -> String {
    match e {
        crate::error::Error::Invalid { field, message } if !field.is_empty() => {
            format!("{field}: {message}")
        }
        crate::error::Error::Invalid { message, .. } => message.clone(),
        other => other.to_string(),
    }
}
