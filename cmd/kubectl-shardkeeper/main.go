// Command kubectl-shardkeeper is shardkeeper's command line, usable on its
// own and as a kubectl plugin (kubectl finds it on PATH and runs it as
// "kubectl shardkeeper ...").
//
//	kubectl shardkeeper plan --partitions 4 --shards 8 --to-shards 16 --members 4
//	kubectl shardkeeper plan ... -o json
//
// Each subcommand lives in its own file and is one entry in commands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/shardkeeper/shardkeeper/internal/version"
)

// command is one subcommand: what it does, in a line, and its entry point.
type command struct {
	summary string
	run     func(args []string) error
}

// commands maps each subcommand's name to it. To add one, write
// <name>.go with its run function and add a line here.
var commands = map[string]command{
	"plan":    {summary: "show what a change of N or V would do, without doing it", run: runPlan},
	"census":  {summary: "check every NATS server's version against the floor (exit 1 if not met)", run: runCensus},
	"status":  {summary: "show a ShardTopology's phase, epochs, census and rollout step by step", run: runStatus},
	"version": {summary: "print the version (also --version)", run: runVersion},
}

func runVersion([]string) error {
	version.Print("kubectl-shardkeeper")
	return nil
}

// errUsage marks errors in how the command was called; it exits 2.
var errUsage = errors.New("usage")

func main() {
	if err := dispatch(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kubectl-shardkeeper:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func dispatch(args []string) error {
	if len(args) == 0 || isHelp(args[0]) {
		printUsage()
		if len(args) == 0 {
			return fmt.Errorf("%w: no subcommand", errUsage)
		}
		return nil
	}
	if args[0] == "--version" || args[0] == "-version" {
		args[0] = "version"
	}
	cmd, ok := commands[args[0]]
	if !ok {
		printUsage()
		return fmt.Errorf("%w: unknown subcommand %q", errUsage, args[0])
	}
	err := cmd.run(args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return nil // the flag set printed its usage
	}
	if err != nil {
		return fmt.Errorf("%s: %w", args[0], err)
	}
	return nil
}

func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help"
}

func printUsage() {
	var b strings.Builder
	b.WriteString("Usage: kubectl shardkeeper <subcommand> [flags]\n\nSubcommands:\n")
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		fmt.Fprintf(&b, "  %-10s %s\n", name, commands[name].summary)
	}
	b.WriteString("\nRun 'kubectl shardkeeper <subcommand> -h' for its flags.\n")
	fmt.Fprint(stderr, b.String())
}
