-- Session records and warm-pool entries of SandboxManager, in PostgreSQL. The record
-- itself is JSON (`data`); the columns beside it are what queries select on.
CREATE TABLE sessions (
    tenant     TEXT NOT NULL,
    session    TEXT NOT NULL,
    sandbox_id TEXT,
    data       TEXT NOT NULL,
    PRIMARY KEY (tenant, session)
);

CREATE INDEX sessions_by_sandbox ON sessions (sandbox_id);

CREATE TABLE pool_entries (
    slot       TEXT PRIMARY KEY NOT NULL,
    pool       TEXT NOT NULL,
    ready      BOOLEAN NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    data       TEXT NOT NULL
);

CREATE INDEX pool_entries_by_pool ON pool_entries (pool, ready, created_at);
