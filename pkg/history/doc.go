// Package history is the delivery history that shardkeeper workers keep so
// that promises P1 to P3 of docs/design.md can be judged from what a worker
// did, not from what it says it holds (design.md section 9, "Evidence, not
// self-report").
//
// It owns three things:
//
//   - the record format (Record, one JSON object per line), written by the
//     worker SDK for each fetch, delivery, settlement, withheld row and
//     consumer RESET;
//   - the shared clock (Now): CLOCK_MONOTONIC, which every process on one
//     Linux machine reads alike, so records of different processes can be
//     put on one time line;
//   - a recorder (FileRecorder) that writes one file per process in a way
//     that survives SIGKILL, and ReadDir, which reads those files back.
//
// It does not own the checking: internal/historycheck decides P1, P2, P3,
// completeness and duplicates from these records together with the
// registry's claim history and the sink's writes.
//
// Recording must cost nothing when it is off, so the SDK holds a Recorder
// that is nil when recording is off and tests `if rec != nil` before
// building a Record.
package history
