package devices

import (
	"errors"
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/train"
)

// local hands its peers the engine's flags as Args gives them back: what
// one peer was asked for, every peer gets.
func TestArgsRoundTrip(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"--tf32"},
		{"--no-graph"},
		{"--conv-algos", "any"},
		{"--tf32", "--no-graph", "--conv-algos", "any"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		o := AddFlags(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		if got := o.Args(); !slices.Equal(got, args) {
			t.Errorf("flags %q gave back %q", args, got)
		}
	}
}

func TestConvAlgosFlagChecked(t *testing.T) {
	for _, tc := range []struct {
		arg  string
		want string
		bad  bool
	}{{"", "exact", false}, {"any", "any", false}, {"exact", "exact", false}, {"fast", "", true}} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o := AddFlags(fs)
		var args []string
		if tc.arg != "" {
			args = []string{"--conv-algos", tc.arg}
		}
		err := fs.Parse(args)
		if (err != nil) != tc.bad || !tc.bad && o.ConvAlgos != tc.want {
			t.Errorf("--conv-algos %q: %q, %v; want %q, bad %v", tc.arg, o.ConvAlgos, err, tc.want, tc.bad)
		}
	}
}

func TestConvAlgosChecked(t *testing.T) {
	spec, err := train.BuiltinSpec("mlp", 1, 28, 28, 10)
	if err != nil {
		t.Fatal(err)
	}
	cfg := train.ModelConfig{Spec: spec, Batch: 4, Seed: 1}
	for _, tc := range []struct {
		algos string
		usage bool
	}{{"exact", false}, {"any", false}, {"", false}, {"fastest", true}} {
		m, err := NewModel("host", cfg, Options{ConvAlgos: tc.algos})
		if got := errors.Is(err, cli.ErrUsage); got != tc.usage {
			t.Errorf("--conv-algos %q: %v; want a usage error %v", tc.algos, err, tc.usage)
		}
		if c, ok := m.(io.Closer); ok && err == nil {
			c.Close()
		}
	}
}
