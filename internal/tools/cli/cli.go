// Package cli holds the conventions every command of cmd/ shares: -h and
// --help print usage to standard output and exit 0, for the command and
// for each of its subcommands; a bad flag or argument exits 2.
//
// A command with subcommands lists them in a Program. Dispatch answers a
// help request for any subcommand of the table by running it with -h, so
// a subcommand added to the table gets help for free as long as it parses
// its arguments with a flag.FlagSet (FlagSet here, or its own) writing to
// the stderr it is given.
package cli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Command is one subcommand of a Program.
type Command struct {
	Name string
	// Synopsis is its arguments, for the usage line: "[-json]".
	Synopsis string
	// Run runs it and returns the exit code. It parses args with a
	// flag.FlagSet whose output is stderr.
	Run func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// Program is a command with subcommands.
type Program struct {
	Name string
	// Synopsis is the arguments of the program run without a subcommand
	// ("" if it needs one).
	Synopsis string
	Commands []Command
}

// Usage writes the program's usage lines: one per way to run it.
func (p *Program) Usage(w io.Writer) {
	prefix := "usage: "
	if p.Synopsis != "" {
		fmt.Fprintln(w, line(prefix, p.Name, p.Synopsis))
		prefix = "       "
	}
	for _, c := range p.Commands {
		fmt.Fprintln(w, line(prefix, p.Name, c.Name, c.Synopsis))
		prefix = "       "
	}
}

// Dispatch runs the subcommand args[0] names and returns its exit code
// with ok true. If any argument of the subcommand (before "--") asks for
// help, it writes the subcommand's usage to stdout instead and returns 0.
// If args[0] names no subcommand, ok is false: the program handles args
// itself (IsHelp says whether they ask for the program's own help).
func (p *Program) Dispatch(ctx context.Context, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	if len(args) == 0 {
		return 0, false
	}
	i := slices.IndexFunc(p.Commands, func(c Command) bool { return c.Name == args[0] })
	if i < 0 {
		return 0, false
	}
	c := p.Commands[i]
	if WantsHelp(args[1:]) {
		c.Run(ctx, []string{"-h"}, stdout, stdout) // the flag set prints its usage and stops
		return 0, true
	}
	return c.Run(ctx, args[1:], stdout, stderr), true
}

// IsHelp reports whether arg asks for help: -h, -help, --help (as the
// flag package reads them) or help.
func IsHelp(arg string) bool {
	switch arg {
	case "-h", "--h", "-help", "--help", "help":
		return true
	}
	return false
}

// WantsHelp reports whether a flag of args, before "--", asks for help.
func WantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a != "help" && IsHelp(a) {
			return true
		}
	}
	return false
}

// FlagSet returns a flag set for the command name (with its program's
// name: "ntmon status") that reports errors instead of exiting, writes to
// stderr and whose usage is SetUsage's.
func FlagSet(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	SetUsage(fs, name, synopsis)
	return fs
}

// SetUsage makes fs's usage "usage: name synopsis" and its flags.
func SetUsage(fs *flag.FlagSet, name, synopsis string) {
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), line("usage: ", name, synopsis))
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n > 0 {
			fmt.Fprintln(fs.Output(), "\nflags:")
			fs.PrintDefaults()
		}
	}
}

// ParseMain parses the process's arguments into flag.CommandLine for a
// program without subcommands, and exits when it should stop: 0 after -h
// or --help (usage on standard output), 2 after a bad flag or an
// argument that is not a flag (usage on standard error).
func ParseMain(name, synopsis string) {
	fs := flag.CommandLine
	fs.Init(name, flag.ContinueOnError)
	SetUsage(fs, name, synopsis)
	code, ok := Parse(fs, os.Args[1:], os.Stdout)
	if ok && fs.NArg() > 0 {
		fmt.Fprintf(fs.Output(), "%s: unexpected argument %q\n", name, fs.Arg(0))
		fs.Usage()
		code, ok = 2, false
	}
	if !ok {
		os.Exit(code)
	}
}

// Parse parses args into fs and returns the exit code and false if the
// command should stop: 0 after a help request (fs has printed its usage
// to stdout), 2 after a bad flag (fs has printed the error and its usage
// to its output).
func Parse(fs *flag.FlagSet, args []string, stdout io.Writer) (code int, ok bool) {
	if WantsHelp(args) {
		fs.SetOutput(stdout)
	}
	switch err := fs.Parse(args); {
	case err == flag.ErrHelp:
		return 0, false
	case err != nil:
		return 2, false
	}
	return 0, true
}

// line is a usage line: prefix, then the words that are not empty.
func line(prefix string, words ...string) string {
	return prefix + strings.Join(slices.DeleteFunc(words, func(w string) bool { return w == "" }), " ")
}
