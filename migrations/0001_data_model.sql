-- The mirror of GitLab's identity data (SPEC section 1) and envlens' own records.
-- Ids are GitLab's own; paths are matched case-insensitively, as GitLab does.

CREATE TABLE namespaces (
    id            bigint PRIMARY KEY,
    parent_id     bigint REFERENCES namespaces (id) ON DELETE SET NULL,
    path          text   NOT NULL,
    full_path     text   NOT NULL,
    -- Ids from the top-level group down to this one; empty until linked.
    traversal_ids bigint[] NOT NULL DEFAULT '{}',
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX namespaces_full_path_key ON namespaces (lower(full_path));
CREATE INDEX namespaces_parent_id_idx ON namespaces (parent_id);
-- Descendants of a group: `traversal_ids @> ARRAY[group_id]`.
CREATE INDEX namespaces_traversal_ids_idx ON namespaces USING gin (traversal_ids);

CREATE TABLE projects (
    id           bigint PRIMARY KEY,
    -- The group the project lives in; NULL for personal projects or a group not mirrored yet.
    namespace_id bigint REFERENCES namespaces (id) ON DELETE SET NULL,
    path         text NOT NULL,
    full_path    text NOT NULL,
    visibility   text NOT NULL DEFAULT 'private' CHECK (visibility IN ('private', 'internal', 'public')),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX projects_full_path_key ON projects (lower(full_path));
CREATE INDEX projects_namespace_id_idx ON projects (namespace_id);

CREATE TABLE users (
    id         bigint PRIMARY KEY,
    username   text    NOT NULL,
    admin      boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX users_username_key ON users (lower(username));

-- Memberships are polymorphic (a project or a group), so the source has no foreign key:
-- a membership may arrive before its project or group does.
CREATE TABLE members (
    user_id      bigint  NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    source_type  text    NOT NULL CHECK (source_type IN ('project', 'group')),
    source_id    bigint  NOT NULL,
    access_level integer NOT NULL CHECK (access_level IN (5, 10, 15, 20, 30, 40, 50)),
    PRIMARY KEY (user_id, source_type, source_id)
);
CREATE INDEX members_source_idx ON members (source_type, source_id);

CREATE TABLE cluster_agents (
    id         bigint PRIMARY KEY,
    -- The agent's configuration project.
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name       text   NOT NULL,
    -- `.gitlab/agents/<name>/config.yaml` as JSON; NULL until the first configuration arrives.
    config     jsonb,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT cluster_agents_project_id_name_key UNIQUE (project_id, name)
);

-- The resolved entries of `ci_access` and `user_access`, one row per project or group entry,
-- with the entry's own configuration. Rebuilt whenever a configuration arrives.
CREATE TABLE agent_ci_access_authorizations (
    agent_id   bigint NOT NULL REFERENCES cluster_agents (id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects (id) ON DELETE CASCADE,
    group_id   bigint REFERENCES namespaces (id) ON DELETE CASCADE,
    config     jsonb  NOT NULL,
    CHECK (num_nonnulls(project_id, group_id) = 1)
);
CREATE UNIQUE INDEX agent_ci_access_authorizations_project_key
    ON agent_ci_access_authorizations (project_id, agent_id) WHERE project_id IS NOT NULL;
CREATE UNIQUE INDEX agent_ci_access_authorizations_group_key
    ON agent_ci_access_authorizations (group_id, agent_id) WHERE group_id IS NOT NULL;
CREATE INDEX agent_ci_access_authorizations_agent_id_idx ON agent_ci_access_authorizations (agent_id);

CREATE TABLE agent_user_access_authorizations (
    agent_id   bigint NOT NULL REFERENCES cluster_agents (id) ON DELETE CASCADE,
    project_id bigint REFERENCES projects (id) ON DELETE CASCADE,
    group_id   bigint REFERENCES namespaces (id) ON DELETE CASCADE,
    config     jsonb  NOT NULL,
    CHECK (num_nonnulls(project_id, group_id) = 1)
);
CREATE UNIQUE INDEX agent_user_access_authorizations_project_key
    ON agent_user_access_authorizations (project_id, agent_id) WHERE project_id IS NOT NULL;
CREATE UNIQUE INDEX agent_user_access_authorizations_group_key
    ON agent_user_access_authorizations (group_id, agent_id) WHERE group_id IS NOT NULL;
CREATE INDEX agent_user_access_authorizations_agent_id_idx ON agent_user_access_authorizations (agent_id);

CREATE TABLE environments (
    id         bigint PRIMARY KEY,
    project_id bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name       text   NOT NULL,
    slug       text   NOT NULL,
    tier       text   CHECK (tier IN ('production', 'staging', 'testing', 'development', 'other')),
    state      text   NOT NULL DEFAULT 'available',
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT environments_project_id_name_key UNIQUE (project_id, name)
);
CREATE INDEX environments_tier_project_id_idx ON environments (tier, project_id);

CREATE TABLE deployments (
    id                bigint PRIMARY KEY,
    iid               bigint,
    project_id        bigint NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    -- NULL while only a deployment hook has been seen: it names the environment, not its id.
    environment_id    bigint REFERENCES environments (id) ON DELETE CASCADE,
    -- The environment's name from a deployment hook, until the creation call links it.
    environment_name  text,
    status            text   NOT NULL CHECK (status IN ('created', 'running', 'success', 'failed', 'canceled', 'skipped', 'blocked')),
    ref               text,
    sha               text,
    tag               boolean,
    job_id            bigint,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    -- When GitLab changed the status last: deployment hooks are applied in this order.
    status_changed_at timestamptz
);
-- `lastDeployment(status:)`: the highest id of an environment in a status is one index probe.
CREATE INDEX deployments_environment_id_status_id_idx ON deployments (environment_id, status, id DESC);
CREATE INDEX deployments_project_id_idx ON deployments (project_id);

-- Exactly the blueprint's table.
CREATE TABLE agent_deployments (
    deployment_id        bigint NOT NULL UNIQUE REFERENCES deployments (id) ON DELETE CASCADE,
    agent_id             bigint NOT NULL REFERENCES cluster_agents (id) ON DELETE CASCADE,
    kubernetes_namespace varchar(255) NOT NULL
);
CREATE INDEX agent_deployments_agent_id_idx ON agent_deployments (agent_id);

-- The outcome of each deployment's creation call (SPEC 4.3), so that a replay gets the same
-- answer and a different agent or namespace is refused. Checked at commit: the claim is
-- written before the deployment row it belongs to.
CREATE TABLE deployment_creations (
    deployment_id bigint PRIMARY KEY REFERENCES deployments (id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED,
    -- `<config project path>:<agent name>` and namespace as requested; NULL without a `kubernetes` section.
    agent         text,
    namespace     text,
    -- Why no `agent_deployments` row was written; NULL when one was.
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Webhook deliveries already applied, by `X-Gitlab-Event-UUID` or `Idempotency-Key`,
-- written in the same transaction as their effect.
CREATE TABLE webhook_deliveries (
    delivery_id text PRIMARY KEY,
    event       text NOT NULL,
    received_at timestamptz NOT NULL DEFAULT now()
);

-- The lower-cased path of the group a full path lives in: NULL for a top-level path.
CREATE FUNCTION envlens_parent_path(full_path text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN CASE WHEN strpos(full_path, '/') = 0 THEN NULL
                ELSE lower(regexp_replace(full_path, '/[^/]*$', '')) END;

-- Whether `full_path` lies below `prefix` (lower-cased), case-insensitively. A byte-wise range
-- ('/' is followed by '0'), so that it inlines into an index scan on the C-collated paths.
CREATE FUNCTION envlens_below(full_path text, prefix text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN lower(full_path) COLLATE "C" >= (prefix || '/') COLLATE "C"
       AND lower(full_path) COLLATE "C" < (prefix || '0') COLLATE "C";

-- `prefix` itself or below it.
CREATE FUNCTION envlens_in_subtree(full_path text, prefix text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN lower(full_path) COLLATE "C" = prefix COLLATE "C" OR envlens_below(full_path, prefix);

CREATE INDEX namespaces_full_path_c_idx ON namespaces ((lower(full_path) COLLATE "C"));
CREATE INDEX projects_full_path_c_idx ON projects ((lower(full_path) COLLATE "C"));

-- Whether `haystack` contains `needle` case-insensitively, `%` and `_` in the needle taken literally.
CREATE FUNCTION envlens_contains(haystack text, needle text) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    RETURN haystack ILIKE '%' || replace(replace(replace(needle, '\', '\\'), '%', '\%'), '_', '\_') || '%';
