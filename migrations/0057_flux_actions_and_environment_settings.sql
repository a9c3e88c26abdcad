-- GitOps environments (SPEC 15): the Flux actions people asked for, and what project
-- Maintainers set on an environment beside what GitLab tells envlens.
--
-- Every Flux action (reconcile, suspend, resume) is audited here, those envlens refused before
-- the cluster was asked included (answer_code 403). The user is kept by id and by the name
-- they had then: an audit outlives renames and departures, so no foreign key to `users`.
CREATE TABLE flux_actions (
    id             bigserial PRIMARY KEY,
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    user_id        bigint NOT NULL,
    username       text   NOT NULL,
    kind           text   NOT NULL CHECK (kind IN ('RECONCILE', 'SUSPEND', 'RESUME')),
    -- The Flux resource path, as GitLab writes `flux_resource_path`.
    resource       text   NOT NULL,
    -- The cluster's HTTP status, or envlens' own 403 for a refusal before the cluster.
    answer_code    integer NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);
-- `Environment.fluxActions` is newest first, by id.
CREATE INDEX flux_actions_environment_id_idx ON flux_actions (environment_id, id DESC);

-- What Maintainers set on an environment: namespaces beyond its deployment's (the labels source
-- applies there too, SPEC 15), and the Argo CD Application bound to it (`<namespace>/<name>`
-- in the cluster of the environment's agent, both NULL when unbound).
CREATE TABLE environment_settings (
    environment_id             bigint PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    namespaces                 text[] NOT NULL DEFAULT '{}',
    argo_application_namespace text,
    argo_application_name      text,
    updated_at                 timestamptz NOT NULL DEFAULT now(),
    CHECK ((argo_application_namespace IS NULL) = (argo_application_name IS NULL))
);
