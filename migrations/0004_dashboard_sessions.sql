-- Signing in to envlens' own dashboard (SPEC 9). Every secret a browser or a terminal holds
-- (the session cookie, a sign-in link, an OAuth `state`) is stored only as its SHA-256: a copy
-- of the database signs nobody in. Rows end with their user, and expire.

-- A signed-in browser: the `envlens_session` cookie.
CREATE TABLE web_sessions (
    id_hash    bytea PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- Rendered into the dashboard's forms and sent back as `X-Csrf-Token`: not a credential
    -- on its own, so kept as is.
    csrf       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX web_sessions_expires_at_idx ON web_sessions (expires_at);
CREATE INDEX web_sessions_user_id_idx ON web_sessions (user_id);

-- `envlens token --user <name> --sign-in`: a one-time link, five minutes.
CREATE TABLE sign_in_links (
    token_hash bytea PRIMARY KEY,
    user_id    bigint NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    expires_at timestamptz NOT NULL
);

-- "Sign in with GitLab" between the redirect to GitLab and its callback: the nonce and the PKCE
-- verifier, keyed by the `state` sent along.
CREATE TABLE sign_in_attempts (
    state_hash    bytea PRIMARY KEY,
    nonce         text NOT NULL,
    pkce_verifier text NOT NULL,
    return_to     text NOT NULL,
    expires_at    timestamptz NOT NULL
);
CREATE INDEX sign_in_attempts_expires_at_idx ON sign_in_attempts (expires_at);
