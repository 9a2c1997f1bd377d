package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// runArgs runs ringtrain's command line in-process and returns what it
// wrote and its error.
func runArgs(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = run(context.Background(), args, &o, &e)
	return o.String(), e.String(), err
}

// TestEveryCommandHasHelp: every command answers -h with its flags and
// exits 0, and --version with the version; none starts anything.
func TestEveryCommandHasHelp(t *testing.T) {
	for _, c := range commands() {
		if c.hidden || c.name == "version" || c.name == "completion" {
			continue
		}
		words := strings.Fields(c.name)
		if _, stderr, err := runArgs(append(words, "-h")...); err != nil || !strings.Contains(stderr, "Usage of "+c.name) {
			t.Errorf("%s -h: %v, %q; want its flags and no error", c.name, err, stderr)
		}
		if stdout, _, err := runArgs(append(words, "--version")...); err != nil || !strings.HasPrefix(stdout, "ringtrain ") {
			t.Errorf("%s --version: %v, %q; want the version", c.name, err, stdout)
		}
	}
	for _, args := range [][]string{{"-h"}, {"help"}, {"bench", "-h"}, {"trace", "-h"}} {
		stdout, _, err := runArgs(args...)
		if err != nil || !strings.Contains(stdout, "usage: ringtrain") {
			t.Errorf("%v: %v, %q; want the usage and no error", args, err, stdout)
		}
	}
	stdout, _, _ := runArgs("bench", "-h")
	for _, want := range []string{"bench allreduce", "bench cpu", "bench served", "bench pipeline", "bench flood"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("bench -h does not list %s:\n%s", want, stdout)
		}
	}
	if stdout, _, err := runArgs("swarm-key", "-h"); err != nil || strings.Contains(stdout, "/key/swarm") {
		t.Errorf("swarm-key -h: %v, printed %q; want its usage, not a key", err, stdout)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if stdout, _, err := runArgs(args...); err != nil || !strings.Contains(stdout, "protocol") {
			t.Errorf("%v: %v, %q; want the version", args, err, stdout)
		}
	}
}

// TestCommandLineMistakes: what is not a command or a flag's value exits 2
// naming it. Before, a stray word ended the flags silently (--bootstrap A
// B dropped B), and a bad --log-level was taken for info.
func TestCommandLineMistakes(t *testing.T) {
	cfg := filepath.Join("..", "..", "testdata", "job.json")
	for _, c := range []struct {
		args []string
		name string // what the error must name
	}{
		{[]string{"join", "--bootstrap", "/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2"}, `"/ip4/127.0.0.1/tcp/2"`},
		{[]string{"join", "--config", cfg, "--log-level", "loud"}, `"loud"`},
		{[]string{"join", "--config", cfg, "--log-format", "xml"}, `"xml"`},
		{[]string{"predict", "--checkpoint", "a", "--image", "b", "extra"}, `"extra"`},
		{[]string{"swarm-key", "extra"}, `"extra"`},
		{[]string{"nosuch"}, `"nosuch"`},
		{[]string{"bench", "nosuch"}, `"bench nosuch"`},
		{[]string{"bench"}, "say which"},
		{[]string{"completion", "fish"}, `"fish"`},
		{[]string{"join", "--nosuch"}, "nosuch"},
	} {
		_, _, err := runArgs(c.args...)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%v: %v; want a usage error (exit 2) naming %s", c.args, err, c.name)
		}
	}
}

// TestSwarmKeyToAFile: swarm-key -o writes a key that loads, readable by
// its owner alone, and will not overwrite a file.
func TestSwarmKeyToAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "swarm.key")
	if _, _, err := runArgs("swarm-key", "-o", path); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("swarm-key -o: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	if _, _, err := runArgs("swarm-key", "-o", path); err == nil {
		t.Error("swarm-key -o over an existing key: no error")
	}
}

// TestCompletion: the bash script completes commands, a group's commands
// and a command's flags, asking ringtrain itself.
func TestCompletion(t *testing.T) {
	skipShort(t)
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	script, _, err := runArgs("completion", "bash")
	if err != nil {
		t.Fatal(err)
	}
	// ringtrain on PATH, as the script calls it.
	dir := t.TempDir()
	self := os.Getenv("RINGTRAIN_TEST_BIN")
	wrapper := "#!/bin/sh\nexec " + self + " \"$@\"\n"
	if self == "" {
		exe, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		wrapper = "#!/bin/sh\nRINGTRAIN_TEST_AS_MAIN=1 exec " + exe + " \"$@\"\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "ringtrain"), []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		words string
		want  []string
	}{
		{"ringtrain jo", []string{"join"}},
		{"ringtrain bench fl", []string{"flood"}},
		{"ringtrain join --boot", []string{"--bootstrap"}},
		{"ringtrain bench flood --ki", []string{"--kinds"}},
	} {
		words := strings.Fields(c.words)
		sh := script + "\nCOMP_WORDS=(" + c.words + "); COMP_CWORD=" + strconv.Itoa(len(words)-1) + "; _ringtrain; echo \"${COMPREPLY[@]}\"\n"
		cmd := exec.Command(bash, "-c", sh)
		cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", c.words, err, out)
		}
		if got := strings.Fields(string(out)); strings.Join(got, " ") != strings.Join(c.want, " ") {
			t.Errorf("completing %q: %v; want %v", c.words, got, c.want)
		}
	}
}
