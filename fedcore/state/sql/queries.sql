-- The statements of the SQLite LinkState, one per "-- name:" block.
--
-- Parameters are named (:name). Message and run statuses are the values of
-- fedcore.domain.MessageStatus and RunStatus; the state checks every move against
-- their tables before a statement makes it.

-- Timers --------------------------------------------------------------------------

-- name: next_deadline
-- The earliest moment something falls due: a node's heartbeat deadline, a lease
-- running out, a message expiring, a claim running out while its run is starting,
-- a ServerApp's heartbeat deadline while its run is running. NULL when nothing is.
SELECT min(deadline) FROM (
    SELECT min(online_until) AS deadline FROM nodes WHERE online = 1
    UNION ALL
    SELECT min(lease_until) FROM messages WHERE status = 'leased'
    UNION ALL
    SELECT min(expires_at) FROM messages WHERE status IN ('pending', 'leased')
    UNION ALL
    SELECT min(claim_until) FROM runs WHERE status = 'starting'
    UNION ALL
    SELECT min(alive_until) FROM runs WHERE status = 'running'
);

-- name: messages_expiring_at
SELECT
    message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, status
FROM messages
WHERE status IN ('pending', 'leased') AND expires_at = :deadline
ORDER BY position;

-- name: nodes_silent_at
SELECT node_id FROM nodes WHERE online = 1 AND online_until = :deadline ORDER BY position;

-- name: leases_ending_at
SELECT message_id, dst_node_id, status FROM messages
WHERE status = 'leased' AND lease_until = :deadline
ORDER BY position;

-- name: end_lease
UPDATE messages SET status = :status, lease_until = NULL WHERE message_id = :message_id;

-- name: claims_ending_at
SELECT run_id, attempts FROM runs
WHERE status = 'starting' AND claim_until = :deadline
ORDER BY position;

-- name: server_apps_silent_at
SELECT run_id, heartbeat_interval FROM runs
WHERE status = 'running' AND alive_until = :deadline
ORDER BY position;

-- name: extend_online_nodes
-- On opening: the time the link was down does not count against its nodes. Each
-- node still online gets a full patience window from now to heartbeat again.
UPDATE nodes SET online_until = max(online_until, :now + :patience * heartbeat_interval)
WHERE online = 1;

-- name: extend_running_runs
-- On opening, the same for the ServerApps of running runs: they could not heartbeat
-- a link that was down. (A claim's end is not moved: a starting run goes back to
-- pending, which only lets another exec try.)
UPDATE runs SET alive_until = max(alive_until, :now + :patience * heartbeat_interval)
WHERE status = 'running' AND alive_until IS NOT NULL;

-- name: rearm_nodes
-- After the link's own event loop stalled from :since to :now: a node whose deadline
-- passed meanwhile was not heard because nobody listened. A full patience from now.
UPDATE nodes SET online_until = :now + :patience * heartbeat_interval
WHERE online = 1 AND online_until > :since AND online_until <= :now;

-- name: rearm_leases
-- The same for leases (renewed by heartbeats): they run on by the stall's length.
UPDATE messages SET lease_until = lease_until + (:now - :since)
WHERE status = 'leased' AND lease_until > :since AND lease_until <= :now;

-- name: rearm_claims
UPDATE runs SET claim_until = claim_until + (:now - :since)
WHERE status = 'starting' AND claim_until > :since AND claim_until <= :now;

-- name: rearm_server_apps
UPDATE runs SET alive_until = :now + :patience * heartbeat_interval
WHERE status = 'running' AND alive_until > :since AND alive_until <= :now;

-- Nodes ---------------------------------------------------------------------------

-- name: node_id_taken
SELECT 1 FROM nodes WHERE node_id = :id;

-- name: insert_node
INSERT INTO nodes (node_id, heartbeat_interval, online_until)
VALUES (:node_id, :heartbeat_interval, :online_until);

-- name: node_with_key
SELECT node_id FROM nodes WHERE public_key = :public_key;

-- name: bind_node_key
UPDATE nodes SET public_key = :public_key WHERE node_id = :node_id;

-- name: node_online_flag
SELECT online FROM nodes WHERE node_id = :node_id;

-- name: node_is_online
SELECT 1 FROM nodes WHERE node_id = :node_id AND online_until > :now;

-- name: heartbeat
UPDATE nodes SET online = 1, heartbeat_interval = :heartbeat_interval,
    online_until = :online_until
WHERE node_id = :node_id;

-- name: heartbeat_online
-- The heartbeat of a node that is online, in one statement: it changes no row when
-- the node is offline or unknown.
UPDATE nodes SET heartbeat_interval = :heartbeat_interval, online_until = :online_until
WHERE node_id = :node_id AND online = 1;

-- name: set_offline
UPDATE nodes SET online = 0 WHERE node_id = :node_id;

-- name: delete_node
DELETE FROM nodes WHERE node_id = :node_id;

-- name: nodes_to_retire
-- Nodes registered with a key, offline since :before or earlier (retire_nodes).
SELECT node_id FROM nodes
WHERE public_key IS NOT NULL AND online = 0 AND online_until <= :before
ORDER BY position;

-- name: online_node_ids
SELECT node_id FROM nodes WHERE online_until > :now ORDER BY position;

-- Runs ----------------------------------------------------------------------------

-- name: run_id_taken
SELECT 1 FROM runs WHERE run_id = :id;

-- name: insert_run
INSERT INTO runs (run_id, position, run_config, status, seed, bundle_hash, created_at)
VALUES (
    :run_id, (SELECT coalesce(max(position), 0) + 1 FROM runs), :run_config, :status,
    :seed, :bundle_hash, :created_at
);

-- name: run_status
SELECT status FROM runs WHERE run_id = :run_id;

-- name: get_run
SELECT
    run_id, run_config, status, reason, seed, bundle_hash, created_at, finished_at,
    attempts, claim_token, secret_hash
FROM runs WHERE run_id = :run_id;

-- name: list_runs
SELECT run_id, run_config, status, reason, seed, bundle_hash, created_at, finished_at
FROM runs ORDER BY position;

-- name: update_run_status
UPDATE runs SET status = :status, reason = :reason, finished_at = :finished_at
WHERE run_id = :run_id;

-- name: end_claim
-- The run finished: its exec's token is refused from now on; its ServerApp's launch
-- secret is kept, for its last logs and to learn that the run is over.
UPDATE runs SET claim_token = NULL, claim_until = NULL, alive_until = NULL
WHERE run_id = :run_id;

-- name: drop_claim
-- The run is pending again: the claim, and whatever its exec launched, count no more.
UPDATE runs SET claim_token = NULL, claim_until = NULL, secret_hash = NULL
WHERE run_id = :run_id;

-- Claims --------------------------------------------------------------------------

-- name: pending_run_ids
SELECT run_id FROM runs WHERE status = 'pending' ORDER BY position LIMIT :limit;

-- name: next_token
UPDATE fencing SET last_token = last_token + 1 RETURNING last_token;

-- name: claim_run
UPDATE runs SET
    status = :status, reason = :reason, attempts = attempts + 1, claim_token = :token,
    claim_until = :claim_until, secret_hash = :secret_hash
WHERE run_id = :run_id;

-- name: renew_claim
-- A running run's exec renews only while its ServerApp process lives: the renewal
-- vouches for the process until the claim's new end (see fedcore.state.base).
UPDATE runs SET
    claim_until = :claim_until,
    alive_until = CASE WHEN status = 'running' AND alive_until IS NOT NULL
        THEN max(alive_until, :claim_until) ELSE alive_until END
WHERE run_id = :run_id;

-- name: vouch_until_claim_ends
UPDATE runs SET alive_until = max(alive_until, claim_until) WHERE run_id = :run_id;

-- name: watch_server_app
-- A heartbeat never shortens what the exec's renewals vouched for.
UPDATE runs SET
    heartbeat_interval = :heartbeat_interval,
    alive_until = max(coalesce(alive_until, :alive_until), :alive_until)
WHERE run_id = :run_id;

-- Bundles, contexts and logs ------------------------------------------------------

-- name: insert_bundle
INSERT INTO bundles (bundle_hash, data) VALUES (:bundle_hash, :data)
ON CONFLICT (bundle_hash) DO NOTHING;

-- name: bundle_exists
SELECT 1 FROM bundles WHERE bundle_hash = :bundle_hash;

-- name: get_bundle
SELECT data FROM bundles WHERE bundle_hash = :bundle_hash;

-- name: save_context
-- Room for the state's bytes, written next through incremental blob I/O.
INSERT INTO contexts (run_id, node_id, state) VALUES (:run_id, :node_id, zeroblob(:size))
ON CONFLICT (run_id, node_id) DO UPDATE SET state = excluded.state
RETURNING rowid;

-- name: load_context
SELECT rowid FROM contexts WHERE run_id = :run_id AND node_id = :node_id;

-- name: last_log_seq
SELECT coalesce(max(seq), 0) FROM logs WHERE run_id = :run_id;

-- name: last_log_batch
SELECT last_log_batch FROM runs WHERE run_id = :run_id;

-- name: set_last_log_batch
UPDATE runs SET last_log_batch = :batch WHERE run_id = :run_id;

-- name: insert_log
INSERT INTO logs (run_id, seq, time, text) VALUES (:run_id, :seq, :time, :text);

-- name: get_logs
SELECT seq, time, text FROM logs
WHERE run_id = :run_id AND seq > :after
ORDER BY seq
LIMIT :limit;

-- Metrics and artifacts ----------------------------------------------------------

-- name: last_metrics_seq
SELECT coalesce(max(seq), 0) FROM metrics WHERE run_id = :run_id;

-- name: last_metrics_batch
SELECT last_metrics_batch FROM runs WHERE run_id = :run_id;

-- name: set_last_metrics_batch
UPDATE runs SET last_metrics_batch = :batch WHERE run_id = :run_id;

-- name: insert_metrics
INSERT INTO metrics (run_id, seq, document) VALUES (:run_id, :seq, :document);

-- name: get_metrics
SELECT seq, document FROM metrics
WHERE run_id = :run_id AND seq > :after
ORDER BY seq
LIMIT :limit;

-- name: put_artifact
-- Room for the content's bytes, written next through incremental blob I/O.
INSERT INTO artifacts (run_id, name, content) VALUES (:run_id, :name, zeroblob(:size))
ON CONFLICT (run_id, name) DO UPDATE SET content = excluded.content
RETURNING rowid;

-- name: get_artifact
SELECT rowid FROM artifacts WHERE run_id = :run_id AND name = :name;

-- name: delete_run_messages
-- Their replies go with them (ON DELETE CASCADE), and their contents once no message
-- or reply refers to them (the triggers *_release_content).
DELETE FROM messages WHERE run_id = :run_id;

-- Messages and replies ------------------------------------------------------------

-- name: message_id_taken
SELECT 1 FROM messages WHERE message_id = :id
UNION ALL
SELECT 1 FROM replies WHERE reply_id = :id;

-- name: message_id_owner
-- The run holding a message id a ServerApp chose; NULL run for a reply's id.
SELECT run_id FROM messages WHERE message_id = :id
UNION ALL
SELECT NULL FROM replies WHERE reply_id = :id;

-- name: insert_content
-- Room for a content's bytes, written next through incremental blob I/O. A content
-- already stored (another message of this push or an earlier one has it) stays as
-- it is, and nothing is inserted: the same hash is the same bytes.
INSERT INTO contents (sha256, data) VALUES (:sha256, zeroblob(:size))
ON CONFLICT (sha256) DO NOTHING;

-- name: content_rowid
-- Where a content's bytes are, for incremental blob I/O.
SELECT rowid FROM contents WHERE sha256 = :sha256;

-- name: insert_message
INSERT INTO messages (
    message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, expires_at,
    status, content_sha256
) VALUES (
    :message_id, :run_id, :dst_node_id, :message_type, :group_id, :created_at, :ttl,
    :expires_at, 'pending', :content_sha256
);

-- name: pending_messages_of_node
SELECT
    message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, content_sha256
FROM messages
WHERE dst_node_id = :node_id AND status = 'pending'
ORDER BY position
LIMIT :limit;

-- name: lease_message
UPDATE messages SET status = :status, lease_until = :lease_until
WHERE message_id = :message_id;

-- name: renew_lease
-- Changes nothing unless the node holds the message's lease now.
UPDATE messages SET lease_until = :lease_until
WHERE message_id = :message_id AND dst_node_id = :node_id AND status = 'leased';

-- name: open_messages_of_node
SELECT
    message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, status
FROM messages
WHERE dst_node_id = :node_id AND status IN ('pending', 'leased')
ORDER BY position;

-- name: message_and_reply
-- A message with its reply, if it has one yet (reply_id is NULL when not).
SELECT
    m.message_id, m.run_id, m.dst_node_id, m.message_type, m.group_id, m.expires_at,
    m.status, m.created_at AS message_created_at, m.ttl AS message_ttl,
    r.reply_id, r.src_node_id, r.created_at, r.ttl, r.generated, r.error_code,
    r.error_reason, r.content_sha256
FROM messages AS m LEFT JOIN replies AS r ON r.message_id = m.message_id
WHERE m.message_id = :message_id;

-- name: replies_of_run
-- Every reply a run holds (not yet acknowledged), in the order they were stored: a
-- reply is written once, so its rowid grows with its arrival.
SELECT
    m.message_id, m.run_id, m.dst_node_id, m.message_type, m.group_id, m.expires_at,
    m.status,
    r.reply_id, r.src_node_id, r.created_at, r.ttl, r.generated, r.error_code,
    r.error_reason, r.content_sha256
FROM messages AS m JOIN replies AS r ON r.message_id = m.message_id
WHERE m.run_id = :run_id
ORDER BY r.rowid;

-- name: insert_reply
INSERT INTO replies (
    message_id, reply_id, src_node_id, created_at, ttl, generated, error_code,
    error_reason, content_sha256
) VALUES (
    :message_id, :reply_id, :src_node_id, :created_at, :ttl, :generated, :error_code,
    :error_reason, :content_sha256
);

-- name: mark_replied
UPDATE messages SET status = :status, lease_until = NULL WHERE message_id = :message_id;

-- name: delete_message
-- Its reply goes with it (ON DELETE CASCADE), and their contents if no other message
-- or reply refers to them (the triggers *_release_content).
DELETE FROM messages WHERE message_id = :message_id;
