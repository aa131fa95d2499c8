-- Session leases with fencing tokens. These columns are the lease's truth; the JSON
-- record's copy is not kept current by renewals. `live` mirrors "holds a sandbox", so a
-- renewal touches only the sessions that need a lease.
ALTER TABLE sessions ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sessions ADD COLUMN lease_owner TEXT;
ALTER TABLE sessions ADD COLUMN lease_expires INTEGER;
ALTER TABLE sessions ADD COLUMN live INTEGER NOT NULL DEFAULT 0;

CREATE INDEX sessions_by_lease_owner ON sessions (lease_owner, live);
