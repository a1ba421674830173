-- Replies keep their content in the contents table too, each distinct content once.
--
-- A reply is written once, so 0003 left its content in its row. But the row was read
-- whole with the reply's status, a 200 MB model with every lookup of its message,
-- and a content in a row cannot be read or written a piece at a time. In contents
-- it is streamed in and out (sqlite3's incremental blob I/O), and a node that
-- echoes the model it was sent stores nothing new.

-- The table is made again: a CHECK names the column that goes.
CREATE TABLE replies_0005 (
    message_id     TEXT    PRIMARY KEY REFERENCES messages (message_id) ON DELETE CASCADE,
    reply_id       TEXT    NOT NULL UNIQUE,
    src_node_id    INTEGER NOT NULL,
    created_at     REAL    NOT NULL,
    ttl            REAL    NOT NULL,
    generated      INTEGER NOT NULL CHECK (generated IN (0, 1)),  -- an error fedcore made
    error_code     INTEGER,
    error_reason   TEXT,
    content_sha256 BLOB    REFERENCES contents (sha256),
    CHECK ((content_sha256 IS NULL) <> (error_code IS NULL)),
    CHECK ((error_code IS NULL) = (error_reason IS NULL))
);

INSERT INTO contents (sha256, data)
SELECT sha256(content), content FROM replies WHERE content IS NOT NULL
ON CONFLICT (sha256) DO NOTHING;
INSERT INTO replies_0005
SELECT
    message_id, reply_id, src_node_id, created_at, ttl, generated, error_code,
    error_reason, CASE WHEN content IS NULL THEN NULL ELSE sha256(content) END
FROM replies;
DROP TABLE replies;
ALTER TABLE replies_0005 RENAME TO replies;

CREATE INDEX replies_by_content ON replies (content_sha256);

-- A content goes with the last message or reply that refers to it. Deleting a
-- message deletes its reply too (ON DELETE CASCADE): whichever of the two triggers
-- runs last finds neither and releases a content they shared.
DROP TRIGGER messages_release_content;

CREATE TRIGGER messages_release_content AFTER DELETE ON messages
BEGIN
    DELETE FROM contents
    WHERE sha256 = old.content_sha256
        AND NOT EXISTS (SELECT 1 FROM messages WHERE content_sha256 = old.content_sha256)
        AND NOT EXISTS (SELECT 1 FROM replies WHERE content_sha256 = old.content_sha256);
END;

CREATE TRIGGER replies_release_content AFTER DELETE ON replies
WHEN old.content_sha256 IS NOT NULL
BEGIN
    DELETE FROM contents
    WHERE sha256 = old.content_sha256
        AND NOT EXISTS (SELECT 1 FROM messages WHERE content_sha256 = old.content_sha256)
        AND NOT EXISTS (SELECT 1 FROM replies WHERE content_sha256 = old.content_sha256);
END;
