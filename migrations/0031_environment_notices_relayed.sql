-- Migration 0030's triggers called pg_notify inside every writing transaction. PostgreSQL
-- serializes the commits of notifying transactions (a database-wide lock held until the commit
-- record is flushed), so concurrent deployment writes committed one at a time:
-- `benches/notify_cost.sh` measured deployment creation 1.9 times slower with them.
--
-- The triggers now append the environment's id to an unlogged table (no WAL, no lock shared
-- with other writers); a relay in each envlens process (`db::live::relay`, every 50 ms) drains
-- it and notifies `envlens_environments` in one transaction per tick. A crash empties an
-- unlogged table; the listeners resync when they listen again, so that loses nothing shown.

CREATE UNLOGGED TABLE environment_notices (environment_id bigint NOT NULL);

CREATE OR REPLACE FUNCTION envlens_notify_deployment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.environment_id IS NOT NULL THEN
    INSERT INTO environment_notices (environment_id) VALUES (NEW.environment_id);
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION envlens_notify_agent_deployment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO environment_notices (environment_id)
    SELECT d.environment_id FROM deployments d
    WHERE d.id = NEW.deployment_id AND d.environment_id IS NOT NULL;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION envlens_notify_environment() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO environment_notices (environment_id) VALUES (NEW.id);
  RETURN NULL;
END $$;
