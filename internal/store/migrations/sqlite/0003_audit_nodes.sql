-- Cluster mode (docs/cluster.md): the node that took a call and the node
-- that served it (the same one unless the call was routed to the node
-- holding the device). Rows written before this migration have neither.
ALTER TABLE audit ADD COLUMN node TEXT NOT NULL DEFAULT '';
ALTER TABLE audit ADD COLUMN served_by TEXT NOT NULL DEFAULT '';
