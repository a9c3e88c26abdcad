-- GitOps environments (SPEC 15): an environment's agent without a deployment job, and the
-- deployments Flux makes (pull-based), recorded by envlens and, with an `api` token, in GitLab.

-- The agent GitLab's environments API names for an environment (`cluster_agent`, 17.5+), with
-- its namespace and Flux resource path, as the sync read it and `ci_access` decided: `agent_id`
-- NULL with the reason when the environment's project may not use the agent. An environment's
-- agent is that of its last successful deployment, else this one.
CREATE TABLE environment_agents (
    environment_id       bigint PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    agent_id             bigint REFERENCES cluster_agents (id) ON DELETE CASCADE,
    kubernetes_namespace varchar(255),
    flux_resource_path   varchar(255),
    -- `<config project path>:<agent name>` as GitLab named it.
    agent_reference      text NOT NULL,
    reason               text,
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK ((agent_id IS NULL) = (reason IS NOT NULL))
);

-- A deployment's id becomes GitLab's once GitLab has created it: what refers to a deployment
-- follows the new id.
ALTER TABLE agent_deployments DROP CONSTRAINT agent_deployments_deployment_id_fkey,
    ADD CONSTRAINT agent_deployments_deployment_id_fkey FOREIGN KEY (deployment_id)
        REFERENCES deployments (id) ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE deployment_creations DROP CONSTRAINT deployment_creations_deployment_id_fkey,
    ADD CONSTRAINT deployment_creations_deployment_id_fkey FOREIGN KEY (deployment_id)
        REFERENCES deployments (id) ON DELETE CASCADE ON UPDATE CASCADE DEFERRABLE INITIALLY DEFERRED;
ALTER TABLE snapshot_jobs DROP CONSTRAINT snapshot_jobs_deployment_id_fkey,
    ADD CONSTRAINT snapshot_jobs_deployment_id_fkey FOREIGN KEY (deployment_id)
        REFERENCES deployments (id) ON DELETE CASCADE ON UPDATE CASCADE;
ALTER TABLE deployment_snapshots DROP CONSTRAINT deployment_snapshots_deployment_id_fkey,
    ADD CONSTRAINT deployment_snapshots_deployment_id_fkey FOREIGN KEY (deployment_id)
        REFERENCES deployments (id) ON DELETE CASCADE ON UPDATE CASCADE;

-- envlens' own ids of pull-based deployments: negative, never a GitLab id.
CREATE SEQUENCE pull_deployment_ids;

-- One row per revision a bound Flux object applied, in the order seen (`own_id` descending):
-- the environment's last row is the revision last recorded, so the same revision seen again
-- (a restart, another replica) records nothing.
CREATE TABLE pull_deployments (
    deployment_id  bigint PRIMARY KEY REFERENCES deployments (id) ON DELETE CASCADE ON UPDATE CASCADE,
    own_id         bigint NOT NULL UNIQUE CHECK (own_id < 0),
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    -- The Flux resource path of the object that applied it, and the revision as Flux wrote it.
    source         text NOT NULL,
    revision       text NOT NULL,
    -- The object's `metadata.resourceVersion` when seen: an older look (a lagging cache, another
    -- replica's) never records after a newer one.
    resource_version bigint,
    -- GitLab's id once its `POST /projects/:id/deployments` answered.
    gitlab_id      bigint UNIQUE,
    -- Why no deployment was sent to GitLab (no branch, no `api` token); NULL when one is.
    gitlab_reason  text,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX pull_deployments_environment_idx ON pull_deployments (environment_id, own_id);

-- GitLab's side of a pull-based deployment, retried as the other follow-ups are.
ALTER TABLE gitlab_followups DROP CONSTRAINT gitlab_followups_kind_check,
    ADD CONSTRAINT gitlab_followups_kind_check
        CHECK (kind IN ('environment_lookup', 'agent_refresh', 'pull_create', 'pull_finish'));
CREATE UNIQUE INDEX gitlab_followups_pull_key ON gitlab_followups (kind, deployment_id)
    WHERE kind IN ('pull_create', 'pull_finish');
