-- The first schema of the SQLite LinkState.
--
-- Times are seconds on the link's clock (Unix time, see fedcore.clock); +Inf stands for
-- "never". Deadlines are stored, not scheduled: a restarted link finds every timer in
-- these columns. A message's status follows fedcore.domain.lifecycle; "acknowledged"
-- is never stored, because acknowledging deletes the message and its reply.

CREATE TABLE nodes (
    position           INTEGER PRIMARY KEY,  -- registration order (rowid, only grows)
    node_id            INTEGER NOT NULL UNIQUE,
    heartbeat_interval REAL    NOT NULL CHECK (heartbeat_interval > 0),
    online_until       REAL    NOT NULL,
    online             INTEGER NOT NULL DEFAULT 1 CHECK (online IN (0, 1))
    -- online = 1 until the state has declared the node offline; get_node_ids goes by
    -- online_until, so a node past its deadline is never listed, swept or not.
);

-- The heartbeat deadlines still to watch.
CREATE INDEX nodes_watched ON nodes (online_until) WHERE online = 1;

CREATE TABLE runs (
    run_id     INTEGER PRIMARY KEY,
    run_config BLOB    NOT NULL,  -- RecordDict {"run_config": ConfigRecord}, by fedcore.wire
    status     TEXT    NOT NULL CHECK (status IN (
        'pending', 'starting', 'running',
        'finished:completed', 'finished:failed', 'finished:stopped'
    )),
    reason     TEXT    NOT NULL DEFAULT '',
    seed       INTEGER
);

-- A ServerApp's message to one node. Its sender is always the ServerApp
-- (SERVER_NODE_ID) and it replies to nothing, so neither is stored.
CREATE TABLE messages (
    position     INTEGER PRIMARY KEY,  -- push order: pulls hand out the oldest first
    message_id   TEXT    NOT NULL UNIQUE,
    run_id       INTEGER NOT NULL REFERENCES runs (run_id),
    dst_node_id  INTEGER NOT NULL,  -- not a foreign key: a message to an unknown node
                                    -- is stored, and answered at once
    message_type TEXT    NOT NULL,
    group_id     TEXT    NOT NULL,
    created_at   REAL    NOT NULL,
    ttl          REAL    NOT NULL CHECK (ttl > 0),
    expires_at   REAL    NOT NULL,  -- created_at + ttl, as Metadata.expires_at adds them
    status       TEXT    NOT NULL CHECK (status IN ('pending', 'leased', 'replied')),
    lease_until  REAL,              -- when a lease runs out; NULL when not leased, or
                                    -- leased until the message expires
    content      BLOB    NOT NULL,  -- RecordDict, by fedcore.wire
    CHECK (lease_until IS NULL OR status = 'leased')
);

CREATE INDEX messages_by_node ON messages (dst_node_id, status, position);
CREATE INDEX messages_by_run ON messages (run_id);
-- The expiry and lease deadlines still to watch.
CREATE INDEX messages_expiring ON messages (expires_at) WHERE status IN ('pending', 'leased');
CREATE INDEX messages_leases ON messages (lease_until) WHERE status = 'leased';

-- The one reply to a message: the primary key is what makes it one. Its run, group,
-- type and destination (the ServerApp) come from the message it answers.
CREATE TABLE replies (
    message_id   TEXT    PRIMARY KEY REFERENCES messages (message_id) ON DELETE CASCADE,
    reply_id     TEXT    NOT NULL UNIQUE,
    src_node_id  INTEGER NOT NULL,
    created_at   REAL    NOT NULL,
    ttl          REAL    NOT NULL,
    generated    INTEGER NOT NULL CHECK (generated IN (0, 1)),  -- an error fedcore made
    error_code   INTEGER,
    error_reason TEXT,
    content      BLOB,  -- RecordDict, by fedcore.wire
    CHECK ((content IS NULL) <> (error_code IS NULL)),
    CHECK ((error_code IS NULL) = (error_reason IS NULL))
);
