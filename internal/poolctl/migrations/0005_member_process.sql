-- The process that was granted the member's current incarnation, as the
-- caller of Rejoin named it (NULL for Join). A rejoin by a process that
-- another process under the same member name displaced is refused while
-- the later incarnation is live (ErrDisplaced), but not a rejoin whose
-- earlier reply was lost: that incarnation is the caller's own.
ALTER TABLE shardkeeper.members ADD COLUMN process text;
