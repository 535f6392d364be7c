-- A drain request marks a member whose pod the operator is about to
-- restart: every member leaves its slot out of placement, and the member
-- itself hands everything over. It survives rejoins of the same pod name
-- until the operator clears it, so a restarting process cannot claim again
-- before the operator has replaced it.
ALTER TABLE shardkeeper.members ADD COLUMN draining boolean NOT NULL DEFAULT false;
