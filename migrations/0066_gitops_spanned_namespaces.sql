-- The namespaces a GitOps environment's sources spanned when its group was last read (SPEC 15,
-- issue 33; the labels source's are known without): a hint, not a fact. A first view (after a restart too, which loses every in-memory cache)
-- lists them at once beside its labels' and its sources' own namespaces, instead of waiting
-- for its sources to be read to learn where their inventories point. The group shown is still
-- resolved from the inventories as read: a namespace no longer named is listed for nothing, one
-- newly named is listed in a round after. Rewritten when a view finds them changed.
CREATE TABLE gitops_spanned_namespaces (
    environment_id bigint PRIMARY KEY REFERENCES environments (id) ON DELETE CASCADE,
    namespaces     text[] NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now()
);
