package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
)

// stdout and stderr are where subcommands write; tests replace them.
var (
	stdout io.Writer = os.Stdout
	stderr io.Writer = os.Stderr
)

// Output formats every subcommand accepts with -o.
const (
	formatTable = "table"
	formatJSON  = "json"
)

// outputFlag registers -o and --output on fs and returns the chosen format.
func outputFlag(fs *flag.FlagSet) *string {
	f := new(string)
	fs.StringVar(f, "o", formatTable, "output format: table or json")
	fs.StringVar(f, "output", formatTable, "output format: table or json")
	return f
}

// checkFormat reports whether format is one outputFlag allows.
func checkFormat(format string) error {
	if format != formatTable && format != formatJSON {
		return fmt.Errorf("%w: output format must be %s or %s, got %q", errUsage, formatTable, formatJSON, format)
	}
	return nil
}

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// printTable writes rows under an upper-case header, in columns the way
// kubectl get does.
func printTable(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintln(tw, strings.ToUpper(strings.Join(header, "\t")))
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// newFlagSet returns a flag set for a subcommand that reports errors
// instead of exiting, and prints its usage to stderr.
func newFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("kubectl shardkeeper "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}
