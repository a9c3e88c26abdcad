-- What each person holds open, across every replica (SPEC 13, "Bounded per person"): a row per
-- watch-API socket or GraphQL subscription, written by the replica that serves it and renewed
-- while it runs. A replica that dies stops renewing: its rows count until `expires_at`, then
-- the next count forgets them.
CREATE TABLE user_slots (
    id bigserial PRIMARY KEY,
    user_id bigint NOT NULL,
    kind text NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX user_slots_user_kind_idx ON user_slots (user_id, kind);
CREATE INDEX user_slots_expires_at_idx ON user_slots (expires_at);

-- "Sign in with GitLab" attempts travel in a signed cookie of the browser that started them
-- (`auth::attempt`): nothing is stored before GitLab has answered, so a flood of attempts
-- cannot push out a real one.
DROP TABLE sign_in_attempts;
