-- GitLab 17.7's `environment:kubernetes:flux_resource_path` (18.4: `dashboard:flux_resource_path`),
-- kept with the deployment's agent row and with the creation call's outcome, so that a replay
-- naming another path is a conflict (SPEC 4.3).
ALTER TABLE agent_deployments ADD COLUMN flux_resource_path varchar(255);
ALTER TABLE deployment_creations ADD COLUMN flux_resource_path text;

-- An agent's tokens as GitLab reports them (`GET /projects/:id/cluster_agents/:agent_id/tokens`),
-- replaced as a whole for an agent; never the secret itself. Lengths are GitLab's.
CREATE TABLE cluster_agent_tokens (
    id                 bigint PRIMARY KEY,
    agent_id           bigint NOT NULL REFERENCES cluster_agents (id) ON DELETE CASCADE,
    name               varchar(255) NOT NULL,
    description        varchar(1024),
    status             text NOT NULL CHECK (status IN ('active', 'revoked')),
    created_at         timestamptz NOT NULL,
    created_by_user_id bigint,
    last_used_at       timestamptz
);
-- `ClusterAgent.tokens`: an agent's tokens by id, one index range per agent.
CREATE INDEX cluster_agent_tokens_agent_id_id_idx ON cluster_agent_tokens (agent_id, id);
