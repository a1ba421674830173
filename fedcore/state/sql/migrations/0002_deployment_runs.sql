-- Runs in deployment: their order and bundle, the exec's claims (fencing tokens and
-- launch secrets), the ServerApp's heartbeat deadline, saved contexts, logs, bundles.
--
-- As in 0001, deadlines are stored times that the state fires as timers: a claim's
-- end while its run is starting, a ServerApp's heartbeat deadline while it is running.

-- Creation order. Runs created before this migration have none recorded: they keep
-- the order of their ids, ahead of every later run.
ALTER TABLE runs ADD COLUMN position INTEGER;
UPDATE runs SET position = (SELECT count(*) FROM runs AS older WHERE older.run_id <= runs.run_id);
CREATE UNIQUE INDEX runs_by_position ON runs (position);

ALTER TABLE runs ADD COLUMN created_at REAL NOT NULL DEFAULT 0;
ALTER TABLE runs ADD COLUMN bundle_hash TEXT NOT NULL DEFAULT '';  -- '' for no bundle
ALTER TABLE runs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0;   -- claims made of it
ALTER TABLE runs ADD COLUMN claim_token INTEGER;  -- the live claim's fencing token; NULL
                                                  -- once the claim ran out or ended
ALTER TABLE runs ADD COLUMN claim_until REAL;     -- when the live claim runs out
ALTER TABLE runs ADD COLUMN secret_hash BLOB;     -- SHA-256 of the latest claim's launch
                                                  -- secret; kept once the run finished
ALTER TABLE runs ADD COLUMN heartbeat_interval REAL;  -- the ServerApp's, once watched
ALTER TABLE runs ADD COLUMN alive_until REAL;     -- the ServerApp's heartbeat deadline

-- The claim and ServerApp deadlines still to watch.
CREATE INDEX runs_claims ON runs (claim_until) WHERE status = 'starting';
CREATE INDEX runs_alive ON runs (alive_until) WHERE status = 'running';

-- The last fencing token handed out, in one row: tokens only grow, across restarts.
CREATE TABLE fencing (
    only       INTEGER PRIMARY KEY CHECK (only = 1),
    last_token INTEGER NOT NULL
);
INSERT INTO fencing (only, last_token) VALUES (1, 0);

-- App bundles, each stored once under the SHA-256 (hex) of its bytes. (Rows this large
-- belong in rowid tables, not WITHOUT ROWID ones; so do contexts.)
CREATE TABLE bundles (
    bundle_hash TEXT PRIMARY KEY,
    data        BLOB NOT NULL
);

-- The context state last saved for a node (or the ServerApp) in a run.
CREATE TABLE contexts (
    run_id  INTEGER NOT NULL REFERENCES runs (run_id),
    node_id INTEGER NOT NULL,  -- not a foreign key: SERVER_NODE_ID is no node
    state   BLOB    NOT NULL,  -- RecordDict, by fedcore.wire
    PRIMARY KEY (run_id, node_id)
);

-- A run's log, numbered from 1 in the order the lines came.
CREATE TABLE logs (
    run_id INTEGER NOT NULL REFERENCES runs (run_id),
    seq    INTEGER NOT NULL CHECK (seq > 0),
    time   REAL    NOT NULL,
    text   TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
