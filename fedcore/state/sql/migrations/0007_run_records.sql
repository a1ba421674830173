-- A run's record beside its log: when it finished, the metrics its ServerApp reports
-- (the lines of a results directory's metrics.jsonl) and its artifacts (named
-- RecordDicts: the final model, later a checkpoint). All outlive the run.

ALTER TABLE runs ADD COLUMN finished_at REAL;  -- NULL until the run is finished:*
ALTER TABLE runs ADD COLUMN last_metrics_batch TEXT NOT NULL DEFAULT '';

-- A run's metrics, numbered from 1 in the order the lines came; each a JSON object.
CREATE TABLE metrics (
    run_id   INTEGER NOT NULL REFERENCES runs (run_id),
    seq      INTEGER NOT NULL CHECK (seq > 0),
    document TEXT    NOT NULL,
    PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;

-- A run's artifacts, one per name. (Rows this large belong in rowid tables.)
CREATE TABLE artifacts (
    run_id  INTEGER NOT NULL REFERENCES runs (run_id),
    name    TEXT    NOT NULL,
    content BLOB    NOT NULL,  -- RecordDict, by fedcore.wire
    PRIMARY KEY (run_id, name)
);
