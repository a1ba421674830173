-- Nodes are known by their public keys (fedcore.auth.keys): a node registers with its key,
-- and registering again with the same key is the same node. Nodes a simulation creates,
-- and those of a link from before node keys, have none. A key belongs to one node at a
-- time; deleting the node frees it.

ALTER TABLE nodes ADD COLUMN public_key BLOB;
CREATE UNIQUE INDEX nodes_by_key ON nodes (public_key) WHERE public_key IS NOT NULL;
