// Command mutatereal is make mutate-real, the real-parts half of the
// mutation table (issue 19): it applies each protocol mutation in turn to
// a copy of the tree, runs the real-parts test chosen to catch it (real
// PostgreSQL, real NATS, the real pkg/worker and reference worker) a number
// of times, and prints how many runs the test failed: mutation, caught by,
// runs.
//
// The copy of the tree is virtual: go's -overlay flag replaces one hook
// file with a mutated copy for every build of the run, the test binary's
// and the worker binary the test builds (fleettest.BuildWorker inherits
// GOFLAGS). The hooks are four small files that leave the code unchanged
// in every real build: pkg/worker/coremutation.go (the member core's
// config: member.Mutate), internal/poolctl/pg_mutate.go (the PostgreSQL
// registry's claim decision: the same bend the twin applies for the
// simulator), cmd/shardkeeper-worker/sinkguard.go (the reference sink's
// write guard) and internal/natsops/mark_mutate.go (the drained-to mark's
// exactness rule). A mutated build exists only here: nothing at run time
// reaches a hook.
//
// A catch means something only if the test passes unmutated, so each
// chosen test first runs once on the tree as it is (the baseline); a row
// whose baseline failed says so instead of counting its catches.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/member"
	"github.com/shardkeeper/shardkeeper/pkg/worker/internal/sim"
)

// hook is a file whose anchor line a mutation replaces.
type hook struct {
	file, anchor string
}

var (
	coreHook = hook{"pkg/worker/coremutation.go", "func coreConfig(c member.Config) member.Config { return c }"}
	pgHook   = hook{"internal/poolctl/pg_mutate.go", "var pgMutation twinMutation"}
	sinkHook = hook{"cmd/shardkeeper-worker/sinkguard.go", "const sinkGuard = worker.GuardSQL"}
	markHook = hook{"internal/natsops/mark_mutate.go", "const markCountsPending = true"}
)

// mutation is one row of the table: the broken rule, how the tree is
// changed, and the real-parts test chosen to catch it.
type mutation struct {
	name string
	hook hook
	// with replaces the hook's anchor line.
	with string
	// pkg and test name the real-parts test (go test -run '^test$' pkg).
	pkg, test string
	// unreachable, set instead of a test, says why no real-parts test
	// can catch the mutation: the real parts never give the rule it
	// breaks the input that rule guards against. The row is printed with
	// the reason and not run, unless -test names a test to try.
	unreachable string
}

// unreachableBecause is m without a test, for the reason why.
func (m mutation) unreachableBecause(why string) mutation {
	m.pkg, m.test, m.unreachable = "", "", why
	return m
}

func coreMutation(m member.Mutation, pkg, test string) mutation {
	return mutation{name: string(m), hook: coreHook, pkg: pkg, test: test,
		with: fmt.Sprintf(`func coreConfig(c member.Config) member.Config {
	m, err := member.Mutate(c, member.Mutation(%q))
	if err != nil {
		panic(err)
	}
	return m
}`, m)}
}

// table is every mutation with its test. Every mutation the simulator
// knows (member.Mutations, sim.WorldMutations) must have a row; main
// refuses to run otherwise, so a new mutation cannot go untested here by
// being forgotten.
var table = []mutation{
	{name: sim.MutAdoptLive, hook: pgHook, with: "var pgMutation = twinMutation{adoptLive: true}",
		pkg: "./pkg/worker", test: "TestSigstopLongerThanLeaseFencesThenRejoins"},
	{name: sim.MutNoGrace, hook: pgHook, with: "var pgMutation = twinMutation{noGrace: true}",
		pkg: "./pkg/worker", test: "TestSigstopLongerThanLeaseFencesThenRejoins"},
	{name: sim.MutNoSinkGuard, hook: sinkHook, with: `const sinkGuard = "(" + worker.GuardSQL + " OR true)"`,
		pkg: "./cmd/shardkeeper-worker", test: "TestSinkWritesOnlyUnderAValidClaim"},
	{name: sim.MutHidePendingBarrier, hook: pgHook, with: "var pgMutation = twinMutation{hidePendingBarrier: true}",
		pkg: "./pkg/worker", test: "TestPerKeyBarrierHoldsKeysMovedIntoAUnitHeldAcrossTheActivation"},
	{name: sim.MutMarkPastPending, hook: markHook, with: "const markCountsPending = false",
		pkg: "./internal/natsops", test: "TestMarkOfIsExactOnlyWhenThePendingRowsAreTheHeldOnes"},
	coreMutation(member.ConfirmDuringHandoverStartsPuller, "./pkg/worker", "TestAConfirmationDuringAHandoverStartsNoPuller"),
	coreMutation(member.ConfirmWithoutVersionCheck, "./pkg/worker", "TestALateConfirmationDoesNotBringBackAReleasedUnit"),
	coreMutation(member.FreezeAckAcrossRejoin, "./pkg/worker", "TestAFreezeAcknowledgementReturningAfterARejoinIsSentAgain"),
	coreMutation(member.LostClaimReplyGuessed, "./pkg/worker", "TestALostClaimReplyThenAPlacementChangeStrandsNothing"),
	coreMutation(member.NoLazyFenceCheck, "./pkg/worker", "TestAStalledCoreStillStopsDeliveryAtTheFenceDeadline"),
	coreMutation(member.NoSelfFence, "./pkg/worker", "TestALateFenceDoesNotLeaveTheMemberFenced"),
	coreMutation(member.SelfFenceAfterExpiry, "./pkg/worker", "TestALateFenceDoesNotLeaveTheMemberFenced"),
	// The rule this mutation breaks (apply a confirmation's answer only
	// while its request is the one in flight) guards against replies
	// that pkg/worker's driver never delivers: it posts exactly one reply
	// per request (driver.go, call), and the core sends its next lease
	// call only after it handled the reply to the last one, so the answer
	// to a Confirm is always the one in flight and the mutated branch
	// never runs. The simulator reaches it with duplicated replies (a
	// retrying driver, a duplicated message); so does the core's scripted
	// scenario. Tried on the real parts, one run each, all passed with it:
	// TestALateFenceDoesNotLeaveTheMemberFenced,
	// TestRecoveryDoesNotRestartAUnitInHandover and both tests of
	// pkg/worker/confirm_test.go.
	coreMutation(member.StaleConfirmationApplied, "", "").unreachableBecause(
		"unreachable: pkg/worker delivers no reply but the one in flight (one reply per request, one lease call at a time)"),
	coreMutation(member.StaleIncarnationGivesUp, "./pkg/worker", "TestAWorkersOwnJoinLandingAfterItsLeaseLapsedDoesNotDisplaceIt"),
	coreMutation(member.StaleIncarnationRejoinsAtOnce, "./pkg/worker", "TestTwoProcessesUnderOnePodNameDoNotTakeTurns"),
	coreMutation(member.UnpinSkippedBeforeFirstPull, "./pkg/worker", "TestSigkillTakeoverReturnsInFlightRows"),
	coreMutation(member.PullersBeforeBarrierRead, "./pkg/worker", "TestPerKeyBarrierHoldsKeysMovedIntoAUnitHeldAcrossTheActivation"),
	coreMutation(member.RecoveryConfirmAppliedFenced, "./pkg/worker", "TestRecoveryDoesNotRestartAUnitInHandover"),
}

// outcome is one run of a test.
type outcome int

const (
	passed outcome = iota
	failed
	broken // did not build or set up: says nothing about the mutation
)

// result is a row's verdict.
type result struct {
	m        mutation
	caught   int
	runs     int
	why      string // the first failure's message
	baseline string // "" when the unmutated test passed
	took     time.Duration
}

func main() {
	runs := flag.Int("runs", 3, "runs of each mutated test")
	only := flag.String("only", "", "comma-separated mutations to run (default: all)")
	test := flag.String("test", "", "run this test for every chosen mutation instead of its own (a search for a catcher)")
	baseline := flag.Bool("baseline", true, "run each chosen test once unmutated first")
	timeout := flag.Duration("timeout", 10*time.Minute, "go test -timeout for each run")
	flag.Parse()
	if err := complete(); err != nil {
		fatal(err)
	}
	root, err := repoRoot()
	if err != nil {
		fatal(err)
	}
	logs, err := os.MkdirTemp("", "mutate-real-")
	if err != nil {
		fatal(err)
	}
	rows := pick(*only, *test)
	fmt.Printf("make mutate-real: %d mutations, %d runs each; logs in %s\n", len(rows), *runs, logs)

	base := map[string]string{} // test -> "" (passed) or why it failed
	if *baseline {
		for _, m := range rows {
			key := m.pkg + " " + m.test
			if _, done := base[key]; done || m.test == "" {
				continue
			}
			start := time.Now()
			o, why, err := runTest(root, logs, "baseline-"+m.test, m, "", *timeout)
			if err != nil {
				fatal(err)
			}
			switch o {
			case passed:
				base[key] = ""
			case failed:
				base[key] = "baseline failed: " + why
			case broken:
				fatal(fmt.Errorf("baseline %s did not run: %s", m.test, why))
			}
			fmt.Printf("baseline %-60s %-6s %s %s\n", m.test, verdict(o), time.Since(start).Round(time.Second), why)
		}
	}

	var results []result
	for _, m := range rows {
		if m.test == "" {
			fmt.Printf("%-38s not run: %s\n", m.name, m.unreachable)
			results = append(results, result{m: m})
			continue
		}
		start := time.Now()
		overlay, err := writeOverlay(root, logs, m)
		if err != nil {
			fatal(err)
		}
		r := result{m: m, baseline: base[m.pkg+" "+m.test]}
		for i := 1; i <= *runs; i++ {
			o, why, err := runTest(root, logs, fmt.Sprintf("%s-%d", m.name, i), m, overlay, *timeout)
			if err != nil {
				fatal(err)
			}
			if o == broken {
				fatal(fmt.Errorf("%s: the mutated tree did not build or set up: %s", m.name, why))
			}
			r.runs++
			if o == failed {
				r.caught++
				if r.why == "" {
					r.why = why
				}
			}
			fmt.Printf("%-38s run %d/%d %-6s %s %s\n", m.name, i, *runs, verdict(o), time.Since(start).Round(time.Second), why)
		}
		r.took = time.Since(start)
		results = append(results, r)
	}
	fmt.Println()
	fmt.Print(render(results))
	for _, r := range results {
		if r.caught < r.runs || r.baseline != "" {
			os.Exit(1)
		}
	}
}

// complete refuses a table that misses one of the simulator's mutations.
func complete() error {
	have := map[string]bool{}
	for _, m := range table {
		have[m.name] = true
	}
	var missing []string
	for _, m := range member.Mutations() {
		if !have[string(m)] {
			missing = append(missing, string(m))
		}
	}
	for _, m := range sim.WorldMutations {
		if !have[m] {
			missing = append(missing, m)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("mutations without a real-parts test in the table: %v", missing)
	}
	return nil
}

func pick(only, test string) []mutation {
	var rows []mutation
	want := map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		if n != "" {
			want[n] = true
		}
	}
	filter := len(want) > 0
	for _, m := range table {
		if filter && !want[m.name] {
			continue
		}
		delete(want, m.name)
		if test != "" {
			m.pkg, m.test = "./pkg/worker", test
			if i := strings.LastIndex(test, " "); i > 0 {
				m.pkg, m.test = test[:i], test[i+1:]
			}
		}
		rows = append(rows, m)
	}
	if len(want) > 0 {
		var names []string
		for n := range want {
			names = append(names, n)
		}
		sort.Strings(names)
		fatal(fmt.Errorf("unknown mutations %v", names))
	}
	return rows
}

// writeOverlay writes m's mutated copy of its hook file and the overlay
// that puts it in the tree's place, and returns the overlay's path.
func writeOverlay(root, logs string, m mutation) (string, error) {
	orig := filepath.Join(root, m.hook.file)
	src, err := os.ReadFile(orig)
	if err != nil {
		return "", fmt.Errorf("read hook: %w", err)
	}
	if n := bytes.Count(src, []byte(m.hook.anchor)); n != 1 {
		return "", fmt.Errorf("hook %s: want its line %q once, found it %d times", m.hook.file, m.hook.anchor, n)
	}
	mutated := bytes.Replace(src, []byte(m.hook.anchor), []byte(m.with), 1)
	file := filepath.Join(logs, m.name+".go")
	if err := os.WriteFile(file, mutated, 0o644); err != nil {
		return "", err
	}
	overlay := filepath.Join(logs, m.name+".overlay.json")
	b, err := json.Marshal(map[string]map[string]string{"Replace": {orig: file}})
	if err != nil {
		return "", err
	}
	return overlay, os.WriteFile(overlay, b, 0o644)
}

// runTest runs m's test once, with the overlay when it is set, and says
// whether it passed, failed (with the first failure's message) or did not
// run at all.
func runTest(root, logs, label string, m mutation, overlay string, timeout time.Duration) (outcome, string, error) {
	cmd := exec.Command("go", "test", "-count=1", "-timeout", timeout.String(), "-run", "^"+m.test+"$", m.pkg)
	cmd.Dir = root
	cmd.Env = os.Environ()
	if overlay != "" {
		// GOFLAGS reaches the worker binary the test builds, too.
		cmd.Env = append(cmd.Env, "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -overlay="+overlay))
	}
	out, err := cmd.CombinedOutput()
	if werr := os.WriteFile(filepath.Join(logs, label+".log"), out, 0o644); werr != nil {
		return broken, "", werr
	}
	if err == nil {
		if bytes.Contains(out, []byte("no tests to run")) {
			return broken, "no test named " + m.test + " in " + m.pkg, nil
		}
		return passed, "", nil
	}
	if _, ok := err.(*exec.ExitError); !ok {
		return broken, "", fmt.Errorf("go test: %w", err)
	}
	s := string(out)
	if strings.Contains(s, "[build failed]") || strings.Contains(s, "[setup failed]") {
		return broken, firstLine(s), nil
	}
	return failed, failure(s, m.test), nil
}

// failure is the message that failed the test: the last message a test
// file printed under its "--- FAIL" marker (the ones before it are its
// logs; the harness's worker logs come from other files), or a panic.
var fileLine = regexp.MustCompile(`^\s+(\w+_test\.go:\d+: .*)$`)

func failure(out, test string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(strings.TrimSpace(l), "--- FAIL: "+test) {
			continue
		}
		last := ""
		for _, m := range lines[i+1:] {
			if strings.HasPrefix(m, "FAIL") || strings.HasPrefix(m, "--- ") || strings.HasPrefix(m, "=== ") {
				break
			}
			if f := fileLine.FindStringSubmatch(m); f != nil {
				last = f[1]
			}
		}
		if last != "" {
			return trim(last)
		}
	}
	for _, l := range lines {
		if strings.HasPrefix(l, "panic: ") {
			return trim(l)
		}
	}
	return "failed (see log)"
}

func trim(s string) string {
	if len(s) > 140 {
		return s[:137] + "..."
	}
	return s
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return trim(l)
}

func verdict(o outcome) string {
	return [...]string{"passed", "FAILED", "broken"}[o]
}

// render prints the table as the README shows it.
func render(rs []result) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "mutation\tcaught by\truns\ttook\tfirst failure")
	for _, r := range rs {
		by := r.m.test
		if r.caught == 0 {
			by = "not caught (" + r.m.test + ")"
		}
		why := r.why
		if r.baseline != "" {
			by, why = "no verdict ("+r.m.test+")", r.baseline
		}
		if r.m.test == "" {
			fmt.Fprintf(w, "%s\t%s\t-\t-\t%s\n", r.m.name, "no real-parts test", r.m.unreachable)
			continue
		}
		fmt.Fprintf(w, "%s\t%s\t%d/%d\t%s\t%s\n", r.m.name, by, r.caught, r.runs, r.took.Round(time.Second), why)
	}
	_ = w.Flush()
	return b.String()
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("not inside the module")
	}
	return filepath.Dir(mod), nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutate-real:", err)
	os.Exit(2)
}
