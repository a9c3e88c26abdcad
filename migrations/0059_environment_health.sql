-- The organization view (SPEC 18): each environment's group health as last kept, so that a
-- list of every production environment filters, sorts and counts by health without building
-- any group. Written by the health recorder (`db::health::record`) when the health changes,
-- conditionally, so that replicas that all observe the same change write it once.
--
-- No row: the environment's group was never read through a connection (its health is null).

CREATE TABLE environment_health (
    environment_id bigint PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    -- The agent and namespace the group was read through: whoever may see the health needs
    -- that agent's user_access.
    agent_id       bigint NOT NULL,
    namespace      text   NOT NULL,
    -- HealthStatus as GraphQL spells it: HEALTHY ... UNKNOWN.
    status         text   NOT NULL,
    -- Severity in SPEC 5.2's order (0 HEALTHY .. 5 UNKNOWN): HEALTH_DESC sorts on it.
    severity       smallint NOT NULL,
    message        text,
    -- When status or message last changed.
    since          timestamptz NOT NULL,
    -- The kinds of the group's resources (`group/version/plural/Kind`): under access_as user,
    -- a viewer sees the health only when their identity may list every one.
    kinds          text[] NOT NULL DEFAULT '{}',
    -- Resources in the group: what keeping it costs against kubernetes.health_budget_objects.
    objects        integer NOT NULL DEFAULT 0,
    -- Set while no replica keeps it current (over the watch budget), since then.
    unkept_since   timestamptz
);
CREATE INDEX environment_health_worst_idx ON environment_health (severity DESC, since DESC, environment_id);

-- A change of health reaches `environmentsUpdated` on every replica through the queue that
-- migration 0031's relay turns into `NOTIFY envlens_environments`.
CREATE FUNCTION envlens_environment_health_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO environment_notices (environment_id) VALUES (NEW.environment_id);
  RETURN NULL;
END $$;

CREATE TRIGGER environment_health_inserted_notify AFTER INSERT ON environment_health
  FOR EACH ROW EXECUTE FUNCTION envlens_environment_health_notice();
CREATE TRIGGER environment_health_updated_notify AFTER UPDATE ON environment_health
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status OR OLD.message IS DISTINCT FROM NEW.message
                     OR OLD.unkept_since IS DISTINCT FROM NEW.unkept_since)
  EXECUTE FUNCTION envlens_environment_health_notice();
