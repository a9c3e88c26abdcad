-- Deployment history (SPEC 10): what each successful deployment left in its cluster.
--
-- A snapshot is a list of resources, kept as a few content-addressed chunks (compressed JSON
-- arrays of resource identities, health and manifest hashes); each manifest is stored once per
-- environment by the SHA-256 of its canonical JSON, compressed. A deployment that changes one
-- image adds one manifest, one chunk and its snapshot row; one that changes nothing adds the
-- row alone. Chunks and manifests are scoped to their environment: an environment's labels are
-- in every manifest anyway, and retention can then collect one environment at a time.

-- The work: one row per successful deployment with an agent, claimed with SKIP LOCKED and a
-- lease, so that two replicas never take the same snapshot and a crash loses nothing.
CREATE TABLE snapshot_jobs (
    deployment_id bigint PRIMARY KEY REFERENCES deployments (id) ON DELETE CASCADE,
    -- `taken`: the first snapshot is due; `settling`: waiting for the rollout to settle;
    -- `done`, `superseded` (a newer deployment of the environment came first), `failed`.
    phase         varchar(16) NOT NULL DEFAULT 'taken',
    due_at        timestamptz NOT NULL DEFAULT now(),
    attempts      integer NOT NULL DEFAULT 0,
    last_error    text,
    claimed_until timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX snapshot_jobs_due_idx ON snapshot_jobs (due_at) WHERE phase IN ('taken', 'settling');

CREATE TABLE history_manifests (
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    hash           bytea NOT NULL,
    body           bytea NOT NULL,
    PRIMARY KEY (environment_id, hash)
);
-- Already compressed: PostgreSQL need not try again.
ALTER TABLE history_manifests ALTER COLUMN body SET STORAGE EXTERNAL;

CREATE TABLE history_chunks (
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    hash           bytea NOT NULL,
    body           bytea NOT NULL,
    PRIMARY KEY (environment_id, hash)
);
ALTER TABLE history_chunks ALTER COLUMN body SET STORAGE EXTERNAL;

-- One row per deployment (the unique key makes a snapshot happen once): the snapshot taken when
-- the deployment succeeded, and the one taken when its rollout settled (`settled_chunks` NULL
-- when the two hold the same resources).
CREATE TABLE deployment_snapshots (
    deployment_id   bigint PRIMARY KEY REFERENCES deployments (id) ON DELETE CASCADE,
    environment_id  bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    taken_at        timestamptz NOT NULL,
    health          varchar(16) NOT NULL,
    health_message  text,
    chunks          bytea[] NOT NULL,
    -- Kinds that could not be listed (refused by the cluster): `[{"apiVersion","kind","code","message"}]`.
    errors          jsonb,
    settled_at      timestamptz,
    settled_health  varchar(16),
    settled_message text,
    settled_chunks  bytea[],
    -- Seconds from `taken_at` to a HEALTHY group; NULL when it did not get there in time.
    time_to_healthy double precision
);
CREATE INDEX deployment_snapshots_environment_idx ON deployment_snapshots (environment_id, deployment_id DESC);

-- `Project.deployment(iid:)`, how the dashboard and `envlens history` name a deployment.
CREATE INDEX deployments_project_id_iid_idx ON deployments (project_id, iid);
