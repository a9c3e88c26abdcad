-- The environment's timeline (SPEC 17): envlens' own events, beside the cluster's Events (which
-- are read from the watch cache, never stored). Kept `history.events_keep` (default 30 days);
-- `db::events::prune` removes older ones.
--
-- Deployments write their events here by trigger, so that every path that records a status
-- (the creation call, GitLab's hooks, the sync; on any replica) records the event once, in the
-- same transaction. Health changes are written by `db::events::record_health`, conditional on
-- the last recorded health of the resource (`environment_health_marks`), so that replicas that
-- all observe the same change record it once.

CREATE TABLE environment_events (
    id             bigserial PRIMARY KEY,
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    type           text   NOT NULL CHECK (type IN ('Normal', 'Warning')),
    -- DeploymentStarted, DeploymentFinished, HealthChanged, GroupHealthChanged.
    reason         text   NOT NULL,
    message        text   NOT NULL,
    -- The resource a HealthChanged is about; NULL for the group and for deployments.
    resource_uid   text,
    deployment_id  bigint,
    first_time     timestamptz NOT NULL DEFAULT now(),
    last_time      timestamptz NOT NULL DEFAULT now()
);
-- A page is newest first by last time, then by id: one index range per environment.
CREATE INDEX environment_events_page_idx ON environment_events (environment_id, last_time DESC, id DESC);
CREATE INDEX environment_events_last_time_idx ON environment_events (last_time);

-- The last health recorded per resource of an environment ('' is the group itself): a health
-- change is an event only when it differs from this, whichever replica saw it first.
CREATE TABLE environment_health_marks (
    environment_id bigint NOT NULL REFERENCES environments (id) ON DELETE CASCADE,
    resource_key   text   NOT NULL,
    health         text   NOT NULL,
    marked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (environment_id, resource_key)
);
CREATE INDEX environment_health_marks_marked_at_idx ON environment_health_marks (marked_at);

-- A deployment's status becoming running is DeploymentStarted; success, failed or canceled is
-- DeploymentFinished (Warning unless it succeeded). A status written again is not an event.
CREATE FUNCTION envlens_deployment_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  label text := 'Deployment #' || COALESCE(NEW.iid, NEW.id)::text;
  what  text := concat_ws(' ', NULLIF(NEW.ref, ''), CASE WHEN NEW.sha IS NULL THEN NULL ELSE '(' || left(NEW.sha, 8) || ')' END);
  -- When GitLab says the status changed; a deployment created running started when created.
  at    timestamptz := COALESCE(NEW.status_changed_at,
                                CASE WHEN NEW.status = 'running' THEN NEW.created_at END,
                                NEW.finished_at, now());
BEGIN
  IF NEW.environment_id IS NULL THEN
    RETURN NULL;
  END IF;
  IF TG_OP = 'UPDATE' AND OLD.status = NEW.status
     AND OLD.environment_id IS NOT DISTINCT FROM NEW.environment_id THEN
    RETURN NULL;
  END IF;
  IF NEW.status = 'running' THEN
    INSERT INTO environment_events (environment_id, type, reason, message, deployment_id, first_time, last_time)
    VALUES (NEW.environment_id, 'Normal', 'DeploymentStarted',
            label || ' started' || CASE WHEN what = '' THEN '' ELSE ': ' || what END,
            NEW.id, at, at);
  ELSIF NEW.status IN ('success', 'failed', 'canceled') THEN
    INSERT INTO environment_events (environment_id, type, reason, message, deployment_id, first_time, last_time)
    VALUES (NEW.environment_id, CASE WHEN NEW.status = 'success' THEN 'Normal' ELSE 'Warning' END,
            'DeploymentFinished',
            label || ' ' || NEW.status || CASE WHEN what = '' THEN '' ELSE ': ' || what END,
            NEW.id, at, at);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER deployments_inserted_event AFTER INSERT ON deployments
  FOR EACH ROW EXECUTE FUNCTION envlens_deployment_event();
CREATE TRIGGER deployments_updated_event AFTER UPDATE OF status, environment_id ON deployments
  FOR EACH ROW EXECUTE FUNCTION envlens_deployment_event();

-- A new event reaches `environmentEventsUpdated` on every replica through the queue that
-- migration 0031's relay turns into `NOTIFY envlens_environments`.
CREATE FUNCTION envlens_environment_event_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO environment_notices (environment_id) VALUES (NEW.environment_id);
  RETURN NULL;
END $$;

CREATE TRIGGER environment_events_inserted_notify AFTER INSERT ON environment_events
  FOR EACH ROW EXECUTE FUNCTION envlens_environment_event_notice();
