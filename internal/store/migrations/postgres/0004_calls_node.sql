-- Cluster mode (docs/queued-calls.md): the node that marked a call
-- running, so that a node starting fails as interrupted only the calls it
-- was delivering itself, not those other live nodes are delivering.
ALTER TABLE calls ADD COLUMN node TEXT NOT NULL DEFAULT '';
