package worker

import "github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"

// coreConfig is what Run builds its protocol core from. In every build of
// this tree it returns c unchanged. make mutate-real builds the real parts
// with this file replaced (go build -overlay; pkg/worker/internal/mutatereal)
// by one that applies a member mutation, so a real-parts test can show that
// it notices the broken rule. No option, flag or environment variable
// reaches it: a mutated core exists only in a build that overlays this file.
func coreConfig(c member.Config) member.Config { return c }
