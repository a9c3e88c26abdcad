-- User state (SPEC 13): GitLab's `state` of each user (`active`, `blocked`, `deactivated`,
-- `banned`, `blocked_pending_approval`, `ldap_blocked`, ...) and its `external` flag, from the
-- sync, the `user_failed_login` system hook and the re-read of a signed-in user.
--
-- Only an active user is anyone to envlens: every read of who is calling goes through
-- `active_users`, so that the rule is written once. A user of any other state keeps their row
-- (and memberships) and is refused everywhere, sessions and tokens alike.
ALTER TABLE users
    ADD COLUMN state    text    NOT NULL DEFAULT 'active' CHECK (length(state) BETWEEN 1 AND 64),
    ADD COLUMN external boolean NOT NULL DEFAULT false;

CREATE VIEW active_users AS
    SELECT id, username, admin, external FROM users WHERE state = 'active';
