-- Claims read only the tenant's sessions that hold a sandbox; records written before
-- the lease migration get `live` from their status.
CREATE INDEX sessions_live_by_tenant ON sessions (tenant, live);

UPDATE sessions SET live = 1
WHERE json_extract(data, '$.status') IN ('provisioning', 'running', 'paused', 'idle');
