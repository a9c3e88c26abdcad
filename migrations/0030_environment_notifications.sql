-- Subscriptions (SPEC 8.2): every write that changes what an environment shows (a deployment
-- recorded or its status updated, its agent row, the environment itself) notifies the channel
-- `envlens_environments` with the environment's id, whichever envlens process wrote it. A
-- notification is delivered at commit, once per distinct payload per transaction; listeners
-- read the rows again, so nothing but the id travels.

CREATE FUNCTION envlens_notify_deployment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.environment_id IS NOT NULL THEN
    PERFORM pg_notify('envlens_environments', NEW.environment_id::text);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER deployments_inserted_notify AFTER INSERT ON deployments
  FOR EACH ROW EXECUTE FUNCTION envlens_notify_deployment();
CREATE TRIGGER deployments_updated_notify AFTER UPDATE ON deployments
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION envlens_notify_deployment();

CREATE FUNCTION envlens_notify_agent_deployment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('envlens_environments', d.environment_id::text)
    FROM deployments d WHERE d.id = NEW.deployment_id AND d.environment_id IS NOT NULL;
  RETURN NULL;
END $$;

CREATE TRIGGER agent_deployments_inserted_notify AFTER INSERT ON agent_deployments
  FOR EACH ROW EXECUTE FUNCTION envlens_notify_agent_deployment();
CREATE TRIGGER agent_deployments_updated_notify AFTER UPDATE ON agent_deployments
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION envlens_notify_agent_deployment();

CREATE FUNCTION envlens_notify_environment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('envlens_environments', NEW.id::text);
  RETURN NULL;
END $$;

CREATE TRIGGER environments_inserted_notify AFTER INSERT ON environments
  FOR EACH ROW EXECUTE FUNCTION envlens_notify_environment();
CREATE TRIGGER environments_updated_notify AFTER UPDATE ON environments
  FOR EACH ROW WHEN (OLD.* IS DISTINCT FROM NEW.*) EXECUTE FUNCTION envlens_notify_environment();
