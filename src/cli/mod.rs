//! The subcommands: `serve`, `migrate`, `token`, `print-schema`, `health`.

pub mod health;

use anyhow::Context;
use tokio::net::TcpListener;

use crate::auth::secrets::Secrets;
use crate::auth::{mint_session, Keys};
use crate::config::file::Settings;
use crate::config::{Command, DatabaseArgs, HealthArgs, ServeArgs, TokenArgs};
use crate::db::{self, Database};
use crate::k8s::clusters::Clusters;
use crate::resources::health::Customizations;
use crate::state::AppState;

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve(args).await,
        Command::Migrate(args) => migrate(args).await,
        Command::Token(args) => token(args).await,
        Command::PrintSchema => {
            print!("{}", crate::graphql::sdl());
            Ok(())
        }
        Command::Health(args) => health_command(args),
    }
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
    let clusters = Clusters::load(&settings.kubernetes).await?;
    // A script that does not compile stops envlens here, naming it.
    let health = Customizations::load(
        settings.health.customizations.as_deref(),
        &settings.health.scripts,
    )?;
    let secrets = Secrets::load(&args.secrets, &args.database.data_dir)?;
    for path in &secrets.generated {
        println!("generated secret {}", path.display());
    }
    let database = Database::open(&args.database).await?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let addr = listener.local_addr()?;
    let state = AppState::new(database.pool.clone(), Keys::new(secrets), args.limits)
        .with_clusters(clusters, settings.cors)
        .with_health(health);
    let pruning = tokio::spawn(prune_deliveries(state.db.clone()));
    println!(
        "envlens listening on http://{addr}; GraphQL explorer at http://{addr}/-/graphql-explorer"
    );
    crate::run(
        state,
        listener,
        shutdown_signal(),
        args.limits.shutdown_timeout,
    )
    .await?;
    pruning.abort();
    database.close().await;
    tracing::info!("stopped");
    Ok(())
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

/// Forgets webhook deliveries older than a week, hourly.
async fn prune_deliveries(pool: sqlx::PgPool) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(3600));
    loop {
        every.tick().await;
        if let Err(e) = db::deliveries::prune(&pool, 7).await {
            tracing::warn!(error = %e, "cannot prune webhook deliveries");
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
    let secrets = Secrets::load(&args.secrets, &args.database.data_dir)?;
    let database = Database::open(&args.database).await?;
    let user = db::identity::find_user_by_username(&database.pool, &args.user).await;
    database.close().await;
    let user = user?.with_context(|| format!("no user `{}` in the identity mirror", args.user))?;
    let (token, csrf) = mint_session(secrets.session.bytes(), user.id, &user.username, args.ttl)?;
    println!("{token}");
    eprintln!(
        "session token for {} (id {}): send it as `Authorization: Bearer <token>`, or as the \
         `_gitlab_kas` cookie with the header `X-Csrf-Token: {csrf}`",
        user.username, user.id
    );
    Ok(())
}
