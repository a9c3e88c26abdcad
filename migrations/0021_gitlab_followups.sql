-- Work that a GitLab hook leaves to be done with GitLab's REST API (SPEC 12.2, 12.3), kept in
-- the transaction that acknowledges the hook, so that GitLab being down loses nothing: the
-- lookup of a deployment's environment (its agent and namespace) after a success hook for a
-- deployment the job never described, and the reading of a project's agent configuration
-- after a push touching `.gitlab/agents/`. Numbered after issue 21, clear of parallel work.
CREATE TABLE gitlab_followups (
    id            bigserial PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('environment_lookup', 'agent_refresh')),
    project_id    bigint NOT NULL,
    -- environment_lookup: the deployment, its environment's name and the deployment's ref.
    deployment_id bigint,
    environment   varchar(255),
    git_ref       varchar(255),
    attempts      integer NOT NULL DEFAULT 0,
    -- When it may next be tried; a worker that takes it moves this ahead (a lease).
    due_at        timestamptz NOT NULL DEFAULT now(),
    -- NULL while pending; then what came of it, in words.
    finished_at   timestamptz,
    outcome       text,
    last_error    text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- One pending lookup per deployment, one pending refresh per project.
CREATE UNIQUE INDEX gitlab_followups_lookup_key ON gitlab_followups (deployment_id)
    WHERE kind = 'environment_lookup';
CREATE UNIQUE INDEX gitlab_followups_refresh_key ON gitlab_followups (project_id)
    WHERE kind = 'agent_refresh' AND finished_at IS NULL;
CREATE INDEX gitlab_followups_due_idx ON gitlab_followups (due_at) WHERE finished_at IS NULL;
