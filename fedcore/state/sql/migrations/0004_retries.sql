-- What makes a ServerApp's retries harmless after a lost response (a link restart).
--
-- Log lines come in named batches; the run keeps the name of its last one, and the
-- same name again appends nothing. (A ServerApp's own message ids need no column:
-- they are the messages' ids.)
ALTER TABLE runs ADD COLUMN last_log_batch TEXT NOT NULL DEFAULT '';
