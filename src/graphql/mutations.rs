//! The schema's mutations (SPEC 15): Flux's actions (`flux_actions`) and what project
//! Maintainers set on an environment (`environment_settings`). Each answers refusals and bad
//! input in its payload's `errors`, in words, never as a server error.

use async_graphql::{Context, MergedObject, ID};

use super::environment_settings::EnvironmentSettingsMutation;
use super::flux_actions::FluxMutation;
use super::types::{conn, project, Gql, Project, Result};
use crate::db::read::{self, EnvironmentRow};

#[derive(MergedObject, Default)]
pub struct Mutation(FluxMutation, EnvironmentSettingsMutation);

/// What a mutation says of an environment the viewer may not read, or that does not exist: the
/// same, so that nobody learns which.
pub(super) const NO_ENVIRONMENT: &str = "The environment does not exist, or you may not see it.";

/// The environment a mutation names (`gid://gitlab/Environment/<n>`, or the bare id), with its
/// project, when the viewer may read it; else the words to answer.
pub(super) async fn readable_environment(
    ctx: &Context<'_>,
    id: &ID,
) -> Result<std::result::Result<(EnvironmentRow, Project), String>> {
    let parsed = id
        .trim_start_matches("gid://gitlab/Environment/")
        .parse::<i64>()
        .ok()
        .filter(|id| *id > 0);
    let Some(id) = parsed else {
        return Ok(Err(format!(
            "environmentId: `{}` is not an environment's global ID (gid://gitlab/Environment/<id>)",
            id.as_str()
        )));
    };
    let row = read::environment_by_id(&mut **conn(ctx).await?, id)
        .await
        .gql()?;
    let Some(row) = row else {
        return Ok(Err(NO_ENVIRONMENT.to_owned()));
    };
    let project = project(ctx, row.project_id).await?;
    if !project.0.readable {
        return Ok(Err(NO_ENVIRONMENT.to_owned()));
    }
    Ok(Ok((row, project)))
}
