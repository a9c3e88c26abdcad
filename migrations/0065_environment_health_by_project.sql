-- The organization view's counts (SPEC 18, issue 36): the scope's kept healths counted by agent
-- and status (`db::health::tally`, in both `environmentHealthCounts` and the page's request)
-- found by project, each readable project's range read in place (project and tier in the index
-- condition, agent and status from the index alone), instead of reading the tier's whole range
-- of `environment_health_tier_worst_idx` and testing each entry's project against the bound
-- array. That test is a hashed set only in a plan of the bound values; PostgreSQL's plan cache
-- moves a prepared statement to its generic plan after five executions when that looks no
-- costlier (it did in every run looked at), and there the array is a parameter, searched
-- element by element for every entry: for 5,000 entries over 100 projects 2.7-23 ms against
-- 2.0-2.7 ms for the plan of the bound values, and 1.7 ms for either plan through this index
-- (BENCHMARKS.md, session 21, on a loaded machine). Both plans now descend once per project,
-- and a group's counts read only its own projects' healths, not the whole tier of the instance.
--
-- The page keeps walking `environment_health_tier_worst_idx` in its order (its plans, custom and
-- generic, were checked with this index present).
CREATE INDEX environment_health_project_idx ON environment_health (project_id, tier)
  INCLUDE (agent_id, status);
