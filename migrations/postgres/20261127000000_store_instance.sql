-- Facts about the store itself. `instance_id` is written once, by the first process to
-- open the store, and names it: managers label the sandboxes they create with it, and
-- reconcile destroys only sandboxes carrying the id of its own store.
CREATE TABLE store_meta (
    name  TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);
