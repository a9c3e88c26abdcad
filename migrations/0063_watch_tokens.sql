-- Watch-API tokens spent (SPEC 8.3, 16): a token is signed, so any replica can check it, and it
-- opens one socket: its id is recorded here the first time a socket is opened with it, and a
-- second use anywhere is refused. A row stays a day past the token's expiry: the owner of a
-- connection checks that a token carried from another replica's socket was really spent there
-- (its watches handed to a new owner); then it goes.

CREATE TABLE watch_tokens_spent (
    id         text        PRIMARY KEY,
    expires_at timestamptz NOT NULL
);

CREATE INDEX watch_tokens_spent_expires_at ON watch_tokens_spent (expires_at);
