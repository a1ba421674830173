-- The statements of the SQLite LinkState, one per "-- name:" block.
--
-- Parameters are named (:name). Message statuses are the values of
-- fedcore.domain.MessageStatus; the state checks every move against its table.

-- Timers --------------------------------------------------------------------------

-- name: next_deadline
-- The earliest moment something falls due: a heartbeat deadline, a lease running
-- out, a message expiring. NULL when nothing is watched.
SELECT min(deadline) FROM (
    SELECT min(online_until) AS deadline FROM nodes WHERE online = 1
    UNION ALL
    SELECT min(lease_until) FROM messages WHERE status = 'leased'
    UNION ALL
    SELECT min(expires_at) FROM messages WHERE status IN ('pending', 'leased')
);

-- name: messages_expiring_at
SELECT message_id, run_id, dst_node_id, ttl FROM messages
WHERE status IN ('pending', 'leased') AND expires_at = :deadline
ORDER BY position;

-- name: nodes_silent_at
SELECT node_id FROM nodes WHERE online = 1 AND online_until = :deadline ORDER BY position;

-- name: leases_ending_at
SELECT message_id, dst_node_id FROM messages
WHERE status = 'leased' AND lease_until = :deadline
ORDER BY position;

-- name: end_lease
UPDATE messages SET status = 'pending', lease_until = NULL WHERE message_id = :message_id;

-- name: extend_online_nodes
-- On opening: the time the link was down does not count against its nodes. Each
-- node still online gets a full patience window from now to heartbeat again.
UPDATE nodes SET online_until = max(online_until, :now + :patience * heartbeat_interval)
WHERE online = 1;

-- Nodes ---------------------------------------------------------------------------

-- name: node_id_taken
SELECT 1 FROM nodes WHERE node_id = :id;

-- name: insert_node
INSERT INTO nodes (node_id, heartbeat_interval, online_until)
VALUES (:node_id, :heartbeat_interval, :online_until);

-- name: node_online_flag
SELECT online FROM nodes WHERE node_id = :node_id;

-- name: node_is_online
SELECT 1 FROM nodes WHERE node_id = :node_id AND online_until > :now;

-- name: heartbeat
UPDATE nodes SET online = 1, heartbeat_interval = :heartbeat_interval,
    online_until = :online_until
WHERE node_id = :node_id;

-- name: set_offline
UPDATE nodes SET online = 0 WHERE node_id = :node_id;

-- name: delete_node
DELETE FROM nodes WHERE node_id = :node_id;

-- name: online_node_ids
SELECT node_id FROM nodes WHERE online_until > :now ORDER BY position;

-- Runs ----------------------------------------------------------------------------

-- name: run_id_taken
SELECT 1 FROM runs WHERE run_id = :id;

-- name: insert_run
INSERT INTO runs (run_id, run_config, status, seed)
VALUES (:run_id, :run_config, :status, :seed);

-- name: run_status
SELECT status FROM runs WHERE run_id = :run_id;

-- name: get_run
SELECT run_id, run_config, status, reason, seed FROM runs WHERE run_id = :run_id;

-- name: update_run_status
UPDATE runs SET status = :status, reason = :reason WHERE run_id = :run_id;

-- name: delete_run_messages
-- Their replies go with them (ON DELETE CASCADE).
DELETE FROM messages WHERE run_id = :run_id;

-- Messages and replies ------------------------------------------------------------

-- name: message_id_taken
SELECT 1 FROM messages WHERE message_id = :id
UNION ALL
SELECT 1 FROM replies WHERE reply_id = :id;

-- name: insert_message
INSERT INTO messages (
    message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, expires_at,
    status, content
) VALUES (
    :message_id, :run_id, :dst_node_id, :message_type, :group_id, :created_at, :ttl,
    :expires_at, 'pending', :content
);

-- name: pending_messages_of_node
SELECT message_id, run_id, dst_node_id, message_type, group_id, created_at, ttl, content
FROM messages
WHERE dst_node_id = :node_id AND status = 'pending'
ORDER BY position
LIMIT :limit;

-- name: lease_message
UPDATE messages SET status = 'leased', lease_until = :lease_until
WHERE message_id = :message_id;

-- name: open_messages_of_node
SELECT message_id, run_id, dst_node_id, ttl FROM messages
WHERE dst_node_id = :node_id AND status IN ('pending', 'leased')
ORDER BY position;

-- name: message_and_reply
-- A message with its reply, if it has one yet (reply_id is NULL when not).
SELECT
    m.message_id, m.run_id, m.dst_node_id, m.message_type, m.group_id, m.expires_at,
    m.status,
    r.reply_id, r.src_node_id, r.created_at, r.ttl, r.generated, r.error_code,
    r.error_reason, r.content
FROM messages AS m LEFT JOIN replies AS r ON r.message_id = m.message_id
WHERE m.message_id = :message_id;

-- name: insert_reply
INSERT INTO replies (
    message_id, reply_id, src_node_id, created_at, ttl, generated, error_code,
    error_reason, content
) VALUES (
    :message_id, :reply_id, :src_node_id, :created_at, :ttl, :generated, :error_code,
    :error_reason, :content
);

-- name: mark_replied
UPDATE messages SET status = 'replied', lease_until = NULL WHERE message_id = :message_id;

-- name: delete_message
-- Its reply goes with it (ON DELETE CASCADE).
DELETE FROM messages WHERE message_id = :message_id;
