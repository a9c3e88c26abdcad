-- Replicas that share the clusters (SPEC 16).
--
-- `replicas`: a row per `serve` process, its heartbeat moved on every fifth of the window
-- (`--replica-window`); a replica whose heartbeat is older than the window is dead, and the live
-- ones are what every replica hashes the cluster connections over (rendezvous hashing).
--
-- `connection_leases`: who watches each cluster connection (keyed by its `source`, the same on
-- every replica with the same configuration). A lease is taken only once it has expired (by the
-- database's clock), and every take moves `generation` on, so that a hold is never confused
-- with an earlier one; a released lease keeps its row (and its generation), expired. Logged
-- tables: they are replicated, and ownership rides through a failover of the database.

CREATE TABLE replicas (
    id            text        PRIMARY KEY,
    advertise_url text        NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE connection_leases (
    connection text        PRIMARY KEY,
    replica    text        NOT NULL,
    generation bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX connection_leases_replica ON connection_leases (replica);
