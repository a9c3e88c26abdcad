-- The organization view at scale (SPEC 18, issue 36): each kept health carries its
-- environment's project and tier, so that the group's counts and its page of unhealthy
-- environments read `environment_health` alone (an index-only scan for the counts, a walk in
-- the page's order for the page) instead of joining every environment of the scope first.
-- The scope itself stays a set of projects decided at read time (the group's readable
-- projects, where each sits now): a project moved to another group needs no copy kept.
--
-- Kept in step by triggers, not by the writers: the health recorder inserts without them,
-- and an environment's tier or project changes wherever `environments` is written.

ALTER TABLE environment_health ADD COLUMN project_id bigint, ADD COLUMN tier text;

UPDATE environment_health h SET project_id = e.project_id, tier = e.tier
FROM environments e WHERE e.id = h.environment_id;

ALTER TABLE environment_health ALTER COLUMN project_id SET NOT NULL;

-- A new kept health takes its environment's project and tier. The environment's row is read
-- `FOR SHARE`: a concurrent change of its tier either waits for this insert (and then updates
-- the row it made) or is waited for (and read as it committed), so neither is lost.
CREATE FUNCTION envlens_environment_health_scope() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  SELECT e.project_id, e.tier INTO NEW.project_id, NEW.tier
  FROM environments e WHERE e.id = NEW.environment_id FOR SHARE;
  RETURN NEW;
END $$;

CREATE TRIGGER environment_health_scope BEFORE INSERT ON environment_health
  FOR EACH ROW EXECUTE FUNCTION envlens_environment_health_scope();

-- An environment whose tier or project changes carries the change to its kept health.
CREATE FUNCTION envlens_environment_scope_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  UPDATE environment_health SET project_id = NEW.project_id, tier = NEW.tier
  WHERE environment_id = NEW.id;
  RETURN NULL;
END $$;

CREATE TRIGGER environment_scope_changed AFTER UPDATE OF project_id, tier ON environments
  FOR EACH ROW WHEN (OLD.project_id IS DISTINCT FROM NEW.project_id OR OLD.tier IS DISTINCT FROM NEW.tier)
  EXECUTE FUNCTION envlens_environment_scope_changed();

-- One index for both reads: a tier's healths worst first, with what the counts and the page's
-- filters test. The page walks it in its order and stops at the page's end; the counts read a
-- tier's range of it alone (index-only). One index, not one per read, so that no estimate of
-- how many rows match can lead the page away from the walk to a scan and a sort.
CREATE INDEX environment_health_tier_worst_idx ON environment_health
  (tier, severity DESC, since DESC, environment_id) INCLUDE (status, agent_id, project_id);
