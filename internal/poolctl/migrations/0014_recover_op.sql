-- shardkeeper registry schema, version 14: Recover's token moves are
-- recorded as what they are (issue 22). Recover moves every claim row's
-- token past what a lost primary may have issued, and the history trigger
-- recorded the move under the row's previous last_op ("claim", "settle"):
-- a move of the row the promoted standby knew, made while the holder the
-- clients knew (a handover only the lost primary had) still believed in a
-- lease only the lost primary had renewed, read as a second valid claim
-- (chaos 14a and 14b, once the operator recovered within that lease). The
-- move gives the unit to nobody: Recover ends the holder's lease in the
-- same transaction, and whoever takes the unit next waits out every lease
-- the lost primary may have granted.
ALTER TABLE shardkeeper.claims DROP CONSTRAINT claims_last_op_check;
ALTER TABLE shardkeeper.claims ADD CONSTRAINT claims_last_op_check
    CHECK (last_op IN ('claim', 'adopt', 'rehome', 'settle', 'handover', 'release', 'recover'));
