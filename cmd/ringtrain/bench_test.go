package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/bench"
	"github.com/ringtrain/ringtrain/p2p"
)

// TestBenchEngines: the host engine follows gorgonia step for step; a
// tolerance no engine can meet makes the command fail.
func TestBenchEngines(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"bench", "engines", "--device", "host", "--model", "mlp", "--steps", "4", "--batch", "8"}
	if err := run(context.Background(), args, &out, &errOut); err != nil || !strings.Contains(out.String(), "differs by") {
		t.Fatalf("bench engines: %v\n%s%s", err, out.String(), errOut.String())
	}
	out.Reset()
	if err := run(context.Background(), append(args, "--tolerance", "-1"), &out, &errOut); !errors.Is(err, bench.ErrEnginesDiffer) {
		t.Errorf("bench engines with tolerance -1 = %v; want bench.ErrEnginesDiffer", err)
	}
}

// TestBenchCPU: one JSON line naming this CPU's kernels and why, the
// matrix kernel the fastest of its trial where there was one.
func TestBenchCPU(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run(context.Background(), []string{"bench", "cpu"}, &out, &errOut); err != nil {
		t.Fatalf("bench cpu: %v (%s)", err, errOut.String())
	}
	var r bench.CPUReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.GEMM == "" || r.GEMMWhy == "" || r.Vector == "" || r.Cores < 1 || r.Arch == "" {
		t.Fatalf("bench cpu printed %s (%v)", out.String(), err)
	}
	best := -1
	for i, rate := range r.GEMMRates {
		if best < 0 || rate.GFLOPS > r.GEMMRates[best].GFLOPS {
			best = i
		}
	}
	if best >= 0 && r.GEMMRates[best].Kernel != r.GEMM {
		t.Errorf("bench cpu chose %s though %s measured fastest: %+v", r.GEMM, r.GEMMRates[best].Kernel, r.GEMMRates)
	}
	if err := run(context.Background(), []string{"bench", "cpu", "now"}, &out, &out); !errors.Is(err, errUsage) {
		t.Errorf("bench cpu now = %v; want a usage error", err)
	}
}

// TestBenchDevice: one JSON line per run and a median line, on the host
// engine (whose steps take the device path: the optimizer bound to the
// net, whole steps on a ring of one) and on gorgonia's.
func TestBenchDevice(t *testing.T) {
	for _, dev := range []string{"host", "cpu"} {
		var out, errOut bytes.Buffer
		args := []string{"bench", "device", "--device", dev, "--model", "mlp", "--batch", "8", "--steps", "3", "--warmup", "2", "--runs", "2"}
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatalf("%s: bench device: %v (%s)", dev, err, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines; want 2 runs and a median:\n%s", dev, len(lines), out.String())
		}
		var last bench.DeviceResult
		if err := json.Unmarshal([]byte(lines[2]), &last); err != nil || !last.Median || last.SamplesPerS <= 0 || last.Batch != 8 || last.Model != "mlp" {
			t.Errorf("%s: median line %s (%v)", dev, lines[2], err)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"bench", "device", "--optimizer", "lbfgs"}, &out, &out); !errors.Is(err, errUsage) {
		t.Errorf("bench device --optimizer lbfgs = %v; want a usage error", err)
	}
}

// TestBenchOverlap: a line per run and a median line, every phase timed
// and the ratios their quotients, for the host engine (a Layered model:
// its buckets go while backward runs) and gorgonia's (they go after).
func TestBenchOverlap(t *testing.T) {
	for _, dev := range []string{"host", "cpu"} {
		var out, errOut bytes.Buffer
		args := []string{"bench", "overlap", "--device", dev, "--model", "mlp", "--batch", "8", "--steps", "3", "--warmup", "1", "--runs", "2", "--bucket-mb", "0.1"}
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Fatalf("%s: bench overlap: %v (%s)", dev, err, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines; want 2 runs and a median:\n%s", dev, len(lines), out.String())
		}
		var last bench.OverlapResult
		if err := json.Unmarshal([]byte(lines[2]), &last); err != nil || !last.Median || last.Peers != 2 || last.Params == 0 {
			t.Fatalf("%s: median line %s (%v)", dev, lines[2], err)
		}
		bound := max(last.ComputeMS, last.RingMS)
		if last.ComputeMS <= 0 || last.RingMS <= 0 || last.StepMS <= 0 || last.WholeMS <= 0 || last.CallsMS <= 0 ||
			last.Ratio != last.StepMS/bound || last.WholeRatio != last.WholeMS/bound {
			t.Errorf("%s: median line %+v: a phase untimed or a ratio not its quotient", dev, last)
		}
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"bench", "overlap", "--peers", "1"}, &out, &out); !errors.Is(err, errUsage) {
		t.Errorf("bench overlap --peers 1 = %v; want a usage error", err)
	}
}

func TestBenchAllreduceJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"bench", "allreduce", "--transport", "mem", "--peers", "2", "--sizes", "4KiB", "--iters", "1", "--json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("bench allreduce: %v (%s)", err, errOut.String())
	}
	var row map[string]any
	if err := json.Unmarshal(out.Bytes(), &row); err != nil {
		t.Fatalf("output %q is not one JSON object: %v", out.String(), err)
	}
	for _, k := range []string{"transport", "peers", "bytes", "seconds", "algbw_GBps", "busbw_GBps", "ceiling_busbw_GBps"} {
		if _, ok := row[k]; !ok {
			t.Errorf("JSON row %v lacks %q", row, k)
		}
	}
}

// TestHelpIsNotAnError: --help on any command prints its flags and
// succeeds; a flag's placeholder is a word, not a command line.
func TestHelpIsNotAnError(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"join", "--help"}, {"local", "-h"}, {"bench", "device", "--help"}, {"export", "-help"}} {
		var out, errOut bytes.Buffer
		if err := run(context.Background(), args, &out, &errOut); err != nil {
			t.Errorf("run(%q) = %v; want nil", args, err)
		}
		if out.Len()+errOut.Len() == 0 {
			t.Errorf("run(%q) printed nothing", args)
		}
	}
	var out bytes.Buffer
	run(context.Background(), []string{"join", "--help"}, &out, &out)
	if strings.Contains(out.String(), "-identity ringtrain") || !strings.Contains(out.String(), "-identity string") {
		t.Errorf("join's usage shows a command as a placeholder:\n%s", out.String())
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{nil, {"frobnicate"}, {"bench"}, {"bench", "allreduce", "--sizes", "lots"},
		{"local", "-n", "2", "--config", "../../testdata/job.json"}, // world_size 3
		{"join", "--config", "../../testdata/job.json", "--reachability", "sometimes"},
		{"bootstrap", "--reachability", "sometimes"}, {"bootstrap", "--bootstrap", "/ip4/127.0.0.1/tcp/1"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out, &out); !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
}

func TestDataCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"data", "--config", "../../testdata/data-config.json"}, &out, &out); err != nil {
		t.Fatalf("data: %v", err)
	}
	for _, want := range []string{"train: ", "2000 images", "test: ", "500 images", "Ankle boot=", "Normalize"} {
		if !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("data output %q lacks %q", out.String(), want)
		}
	}
	if err := run(context.Background(), []string{"data"}, &out, &out); !errors.Is(err, errUsage) {
		t.Errorf("data without --config = %v; want a usage error", err)
	}
	// A text corpus: both parts, in bytes, as no model has named the
	// windows' length yet.
	cfg := filepath.Join(t.TempDir(), "text.json")
	if err := os.WriteFile(cfg, []byte(`{"text": {"folder": "`+mustAbs(t, "../../testdata/text")+`"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"data", "--config", cfg}, &out, &out); err != nil {
		t.Fatalf("data of text: %v", err)
	}
	if got := regexp.MustCompile(`(?m)^(train|test): .*, its (training|validation) part: [1-9]\d* bytes, in windows of the model's context \+ 1$`).FindAllString(out.String(), -1); len(got) != 2 {
		t.Errorf("data of text printed %q; want the training and validation parts' bytes", out.String())
	}
}

func TestSwarmKeyCommand(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"swarm-key"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(out.Bytes(), []byte("/key/swarm/psk/1.0.0/\n/base16/\n")) || out.Len() != 22+9+65 {
		t.Errorf("swarm-key printed %q; want a /key/swarm/psk/1.0.0/ base16 key", out.String())
	}
}

func TestIDCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "id.key")
	var first, second bytes.Buffer
	if err := run(context.Background(), []string{"id", "--identity", path}, &first, &first); err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"id", "--identity", path}, &second, &second); err != nil {
		t.Fatal(err)
	}
	if first.String() != second.String() || !strings.HasPrefix(first.String(), "12D3Koo") {
		t.Errorf("id printed %q, then %q; want the same peer ID twice", first.String(), second.String())
	}
}

// TestBootstrapCommand: `ringtrain bootstrap` prints where it listens, so
// that peers can be pointed at it, serves the relay hop protocol (it starts
// public), and stops cleanly when its context ends.
func TestBootstrapCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"bootstrap", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json"}, w, io.Discard)
		w.Close()
	}()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on /ip4/127.0.0.1/tcp/") {
		t.Fatalf("first line %q (%v); want its address", line, err)
	}
	boot, err := p2p.ParseBootstrap([]string{strings.TrimSpace(strings.TrimPrefix(line, "listening on "))})
	if err != nil {
		t.Fatal(err)
	}
	h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: boot})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	deadline := time.After(20 * time.Second)
	for {
		if ok, _ := h.Peerstore().SupportsProtocols(boot[0].ID, "/libp2p/circuit/relay/0.2.0/hop"); len(ok) > 0 {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("bootstrap stopped: %v", err)
		case <-deadline:
			t.Fatal("the bootstrap peer never served as a relay")
		case <-time.After(20 * time.Millisecond):
		}
		h.Connect(ctx, boot[0])
	}
	go io.Copy(io.Discard, r)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("bootstrap after its context ended: %v", err)
	}
}
