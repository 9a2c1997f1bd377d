package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"regexp"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/bench"
	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/p2p"
)

// command is one of ringtrain's commands: its words ("join", "bench
// flood"), what it does in a line, and what runs it. Hidden ones are
// started by ringtrain itself (a bench's peers) and not listed.
type command struct {
	name     string
	synopsis string
	run      func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	hidden   bool
}

// noCtx adapts a command that takes no context.
func noCtx(f func(args []string, stdout, stderr io.Writer) error) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(_ context.Context, args []string, stdout, stderr io.Writer) error { return f(args, stdout, stderr) }
}

// commands are ringtrain's commands, in the order usage lists them.
func commands() []command {
	return []command{
		{name: "join", synopsis: "find the job's peers, form the ring, train, evaluate", run: runJoinCommand},
		{name: "bootstrap", synopsis: "a peer that trains nothing: the DHT to meet in, AutoNAT, a relay for peers behind NAT", run: runBootstrap},
		{name: "serve", synopsis: "a bootstrap peer that also serves a dataset (--data) to the peers that train on it", run: runServe},
		{name: "local", synopsis: "run -n peers of a job as processes on this machine", run: runLocal},
		{name: "data", synopsis: "load a data config's datasets and say what they hold", run: runData},
		{name: "predict", synopsis: "class and top probabilities of a PNG/JPEG from a checkpoint", run: noCtx(runPredict)},
		{name: "generate", synopsis: "text from a language model's checkpoint, streamed as it is sampled", run: runGenerate},
		{name: "export", synopsis: "write a checkpoint's model as an ONNX file (opset 13)", run: noCtx(runExport)},
		{name: "plot", synopsis: "draw loss, test accuracy and samples/s per rank (or per log file) from JSON logs", run: noCtx(runPlot)},
		{name: "trace merge", synopsis: "put several peers' --trace timelines on one clock, for Perfetto", run: noCtx(runTraceMerge)},
		{name: "bench allreduce", synopsis: "measure ring-allreduce against the pattern ceiling", run: bench.Allreduce},
		{name: "bench form", synopsis: "time ring formation through the DHT on loopback", run: bench.Form},
		{name: "bench engines", synopsis: "hold a device's losses against gorgonia's, step by step", run: noCtx(bench.Engines)},
		{name: "bench device", synopsis: "one device's training samples/s for a model and batch, as JSON", run: bench.Device},
		{name: "bench overlap", synopsis: "a step with its buckets reduced beside backward, against compute alone and the ring alone", run: bench.Overlap},
		{name: "bench cpu", synopsis: "ringtrain's CPU step against PyTorch's, at 1 and 2 threads", run: noCtx(bench.CPU)},
		{name: "bench served", synopsis: "served data's samples/s against a loader on local files", run: bench.Served},
		{name: "bench pipeline", synopsis: "pipeline stages' step time and bubble against one peer", run: noCtx(bench.Pipeline)},
		{name: "bench flood", synopsis: "a job's throughput, memory and goroutines while a hostile peer floods it", run: bench.Flood},
		{name: "bench flood-peer", run: bench.FloodPeer(jobOfConfig), hidden: true},
		{name: "bench allreduce-rank", run: bench.AllreduceRank, hidden: true},
		{name: "bench allreduce-peer", run: bench.AllreducePeer, hidden: true},
		{name: "swarm-key", synopsis: "print a new private-swarm key (give the file to every peer)", run: noCtx(runSwarmKey)},
		{name: "id", synopsis: "create or show this machine's peer ID (--identity FILE)", run: noCtx(runID)},
		{name: "version", synopsis: "print ringtrain's version", run: func(_ context.Context, args []string, stdout, stderr io.Writer) error {
			return versionCommand(args, stdout, stderr)
		}},
		{name: "completion", synopsis: "print a shell completion script: completion bash, or completion zsh", run: noCtx(runCompletion)},
	}
}

// findCommand is the command args begin with — two words before one, so
// that "bench" alone is no command — and the args after its words.
func findCommand(args []string) (command, []string, bool) {
	for _, n := range []int{2, 1} {
		if len(args) < n {
			continue
		}
		name := strings.Join(args[:n], " ")
		for _, c := range commands() {
			if c.name == name {
				return c, args[n:], true
			}
		}
	}
	return command{}, nil, false
}

// usageText lists the commands (those under prefix, if not empty).
func usageText(prefix string) string {
	var b strings.Builder
	b.WriteString("usage: ringtrain <command> [flags]   (ringtrain <command> -h for its flags)\n\ncommands:\n")
	for _, c := range commands() {
		if !c.hidden && strings.HasPrefix(c.name, prefix) {
			fmt.Fprintf(&b, "  %-17s %s\n", c.name, c.synopsis)
		}
	}
	b.WriteString("\nflags: --version, -h\n")
	return b.String()
}

// errVersion and errUsage are cli's, which the subcommands in packages of
// their own return too.
var (
	errVersion = cli.ErrVersion
	errUsage   = cli.ErrUsage
)

// parseFlags is cli.ParseFlags: strict, with --version.
func parseFlags(fs *flag.FlagSet, args []string) error { return cli.ParseFlags(fs, args) }

// version is the module's version and the commit it was built from, as
// the Go toolchain recorded them.
func version() string {
	v, rev, dirty := "(devel)", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		v = bi.Main.Version
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := "ringtrain " + v
	if rev != "" {
		out += " " + rev[:min(12, len(rev))]
		if dirty {
			out += "+changes"
		}
	}
	return fmt.Sprintf("%s (protocol %d)", out, p2p.ProtocolVersion)
}

func versionCommand(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	if err := parseFlags(fs, args); err != nil && !errors.Is(err, errVersion) {
		return fmt.Errorf("version: %w: %w", errUsage, err)
	}
	fmt.Fprintln(stdout, version())
	return nil
}

// runSwarmKey is `ringtrain swarm-key [-o FILE]`.
func runSwarmKey(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("swarm-key", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "write the key to this file (mode 0600) instead of standard output")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("swarm-key: %w: %w", errUsage, err)
	}
	if *out == "" {
		return p2p.WriteSwarmKey(stdout)
	}
	var b bytes.Buffer
	if err := p2p.WriteSwarmKey(&b); err != nil {
		return err
	}
	return writeFilePrivate(*out, b.Bytes())
}

// flagNames are the flags a command's -h lists, each with its dashes: the
// completion script asks for them, so that they are never written twice.
func flagNames(ctx context.Context, c command) []string {
	var help bytes.Buffer
	c.run(ctx, []string{"-h"}, io.Discard, &help)
	var out []string
	for _, m := range regexp.MustCompile(`(?m)^  -(\S+)`).FindAllStringSubmatch(help.String(), -1) {
		if !slices.Contains(out, "--"+m[1]) {
			out = append(out, "--"+m[1])
		}
	}
	return out
}

// runCompletion prints a bash or zsh completion script. The script asks
// ringtrain itself for the commands and each one's flags (the hidden
// __complete command), so it never falls out of date.
func runCompletion(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: ringtrain completion bash|zsh   (source <(ringtrain completion bash))")
	}
	version := cli.AddVersionFlag(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("completion: %w: %w", errUsage, err)
	}
	if *version {
		return errVersion
	}
	if fs.NArg() != 1 || fs.Arg(0) != "bash" && fs.Arg(0) != "zsh" {
		fs.Usage()
		return fmt.Errorf("completion: want bash or zsh, not %q: %w", strings.Join(fs.Args(), " "), errUsage)
	}
	if fs.Arg(0) == "zsh" {
		fmt.Fprintln(stdout, "autoload -U +X bashcompinit && bashcompinit")
	}
	fmt.Fprint(stdout, completionScript)
	return nil
}

const completionScript = `_ringtrain() {
	local cur=${COMP_WORDS[COMP_CWORD]}
	local words=("${COMP_WORDS[@]:1:COMP_CWORD-1}")
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$(ringtrain __complete flags "${words[@]}" 2>/dev/null)" -- "$cur"))
	elif [[ ${#words[@]} -eq 0 || ( ${#words[@]} -eq 1 && ( ${words[0]} == bench || ${words[0]} == trace ) ) ]]; then
		COMPREPLY=($(compgen -W "$(ringtrain __complete commands "${words[@]}" 2>/dev/null)" -- "$cur"))
	else
		COMPREPLY=($(compgen -f -- "$cur"))
	fi
}
complete -o filenames -F _ringtrain ringtrain
`

// runComplete is the hidden __complete: "commands [WORD]" lists the
// commands (or the words after WORD: bench's), "flags WORDS..." the flags
// of the command WORDS begin with.
func runComplete(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("__complete: say commands or flags: %w", errUsage)
	}
	switch args[0] {
	case "commands":
		prefix := strings.Join(args[1:], " ")
		for _, c := range commands() {
			if c.hidden || !strings.HasPrefix(c.name, prefix) {
				continue
			}
			word := strings.Fields(strings.TrimPrefix(c.name, prefix))
			if len(word) > 0 {
				fmt.Fprintln(stdout, word[0])
			}
		}
	case "flags":
		if c, _, ok := findCommand(args[1:]); ok {
			fmt.Fprintln(stdout, strings.Join(flagNames(ctx, c), " "))
		}
	}
	return nil
}
