-- A deploy job's own word on its agent and namespace (SPEC 12.2: `POST /api/v4/ci/deployments`
-- with a CI/CD ID token), kept until GitLab's Deployment Hook names the deployment of that job
-- (its `deployable_id`), in whichever order the two arrive.
CREATE TABLE ci_deployment_requests (
    job_id        bigint PRIMARY KEY,
    project_id    bigint NOT NULL,
    environment   varchar(255) NOT NULL,
    ref_protected boolean NOT NULL,
    git_ref       varchar(255) NOT NULL DEFAULT '',
    -- The request's body: `{"agent", "namespace"}` or GitLab 18's `dashboard` shape.
    kubernetes    jsonb NOT NULL,
    received_at   timestamptz NOT NULL DEFAULT now()
);

-- The deployment of a job, when the hook came first.
CREATE INDEX deployments_job_id_idx ON deployments (job_id) WHERE job_id IS NOT NULL;
