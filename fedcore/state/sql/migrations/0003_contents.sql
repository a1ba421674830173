-- Message contents in a table of their own, each distinct content stored once under
-- the SHA-256 of its bytes.
--
-- A message's status changes several times (leased, renewed, replied); while its
-- content sat in the same row, each change wrote the whole content again (a 4 MiB
-- model, rewritten at every lease). And a ServerApp sends one content to many nodes:
-- stored by its hash, it is written once. A content goes with the last message that
-- refers to it (the trigger below), whichever way messages go: acknowledged, or
-- with their finished run. Replies keep their content in their own row: a reply is
-- written once and never updated.

CREATE TABLE contents (
    sha256 BLOB PRIMARY KEY CHECK (length(sha256) = 32),  -- of data
    data   BLOB NOT NULL                                   -- RecordDict, by fedcore.wire
);

-- Never NULL once this migration is done, though SQLite cannot add a column with
-- both a reference and NOT NULL to a table that has rows.
ALTER TABLE messages ADD COLUMN content_sha256 BLOB REFERENCES contents (sha256);

-- The contents of the messages already stored move over; sha256() is the function
-- fedcore.state.sql.migrate gives the connection.
INSERT INTO contents (sha256, data)
SELECT sha256(content), content FROM messages WHERE true
ON CONFLICT (sha256) DO NOTHING;
UPDATE messages SET content_sha256 = sha256(content);
ALTER TABLE messages DROP COLUMN content;

-- What the trigger looks up: whether any message still refers to a content.
CREATE INDEX messages_by_content ON messages (content_sha256);

CREATE TRIGGER messages_release_content AFTER DELETE ON messages
BEGIN
    DELETE FROM contents
    WHERE sha256 = old.content_sha256
        AND NOT EXISTS (SELECT 1 FROM messages WHERE content_sha256 = old.content_sha256);
END;
