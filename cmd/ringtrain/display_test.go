package main

import (
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

	"github.com/creack/pty"
)

// The display reads peers' JSON records: progress moves a peer's line,
// a change of the job that every member logs is printed once, a peer's
// own events and every warning are printed for it, and noise is not.
func TestDisplayRecords(t *testing.T) {
	var out bytes.Buffer
	d := newDisplay(&out)
	w0, w1 := statusWriter{d: d, peer: 0}, statusWriter{d: d, peer: 1}
	type line struct {
		w    statusWriter
		line string
	}
	feed := func(lines []line) {
		for _, l := range lines {
			if _, err := l.w.Write([]byte(l.line + "\n")); err != nil {
				t.Fatal(err)
			}
		}
	}
	feed([]line{
		{w0, `{"level":"info","message":"looking for peers"}`},
		{w0, `{"level":"info","rank":1,"generation":1,"world_size":2,"message":"ring formed"}`},
		{w1, `{"level":"info","rank":0,"generation":1,"world_size":2,"message":"ring formed"}`},
		{w0, `{"level":"info","epoch":1,"epochs":2,"step":50,"steps":100,"loss":0.5,"samples_per_sec":1000,"elapsed_s":10,"message":"progress"}`},
		{w0, `{"level":"info","epoch":1,"step":50,"steps":100,"loss":0.5,"samples_per_sec":1000,"elapsed_s":10,"message":"training"}` + "\n" + `{"level":"info","message":"compute"}`},
	})
	if got := d.figures(d.peers[0]); got != "50/100 loss 0.5000 1000/s ETA 30s" {
		t.Errorf("peer 0's line: %q", got)
	}
	if got := d.label(d.peers[0]); got != "rank 1 epoch 1/2" {
		t.Errorf("peer 0's label: %q", got)
	}
	feed([]line{
		{w0, `{"level":"warn","error":"stream reset","message":"a neighbour did not close its link before the step timeout; this peer's part was done"}`},
		{w1, `{"level":"info","epoch":1,"step":100,"steps":100,"loss":0.25,"test_accuracy":0.8,"message":"epoch done"}`},
		{w0, `{"level":"info","epoch":1,"step":100,"steps":100,"loss":0.25,"test_accuracy":0.8,"message":"epoch done"}`},
		{w1, `{"level":"info","path":"ckpt/demo.ckpt","message":"checkpoint written"}`},
		{w1, `{"level":"info","test_accuracy":0.8125,"param_hash":"0123456789abcdef0123","message":"summary"}`},
		{w1, `{"level":"info","epoch":2,"loss":1.5,"test_accuracy":0.4,"test_bits_per_byte":3.0978,"message":"epoch done"}`},
		{w0, "panic: not JSON"},
	})
	d.failed(0, errors.New("exit status 1"))
	d.close()
	got := out.String()
	for _, c := range []struct {
		want  string
		times int
	}{
		{"ring formed (2 peers, generation 1)", 1},
		{"rank 1: a neighbour did not close its link before the step timeout; this peer's part was done: stream reset", 1},
		{"epoch 1 done, loss 0.2500, test accuracy 0.8000", 1},
		{"rank 0: checkpoint written (ckpt/demo.ckpt)", 1},
		{"rank 0: finished, test accuracy 0.8125, parameter hash 0123456789abcdef", 1},
		{"rank 0: epoch 2 done, loss 1.5000, validation 3.098 bits per byte", 1},
		{"test accuracy 0.4000", 0},
		{"panic: not JSON", 1},
		{"looking for peers", 0},
		{"compute", 0},
		{"rank 1: failed: exit status 1", 1},
		{"done", 1},
	} {
		if n := strings.Count(got, c.want); n < c.times || c.times == 0 && n > 0 || c.times == 1 && c.want != "done" && n != 1 {
			t.Errorf("%q printed %d times; want %d\n%s", c.want, n, c.times, tails(got))
		}
	}
}

// TestLocalLiveDisplay: `ringtrain local` on a pseudo-terminal shows a
// line per peer (rank, epoch, steps, loss, samples/s, ETA) and the job's
// events, not the peers' JSON logs, which go to --log-file whole.
func TestLocalLiveDisplay(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	// Five epochs: the display redraws every 200 ms, and two epochs of this
	// dataset once ended between two redraws, so no line mid-epoch was seen.
	job := `{"name": "display", "world_size": 2, "epochs": 5, "batch_size": 32, "seed": 1, "model": "mlp",
		"data": "` + mustAbs(t, "../../testdata/data-config.json") + `", "join_timeout": "60s"}`
	cfg := filepath.Join(dir, "job.json")
	if err := os.WriteFile(cfg, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logFile := filepath.Join(dir, "peers.jsonl")
	cmd := peerCommand(ctx, t, "local", "-n", "2", "--config", cfg, "--log-file", logFile)
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var screen bytes.Buffer
	io.Copy(&screen, tty) // until the process and its peers are gone (EIO)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("local: %v\n%s", err, screen.String())
	}
	got := screen.String()
	for _, re := range []string{
		`rank [01] epoch 5/5 +\[=+\] done`,
		`rank [01] epoch [1-5]/5 +\[[=> ]+\] \d+/\d+ loss \d\.\d{4} \d+/s ETA \d+s`,
		`rank [01]: ring formed \(2 peers, generation 1\)`,
		`rank [01]: epoch 1 done, loss \d\.\d{4}, test accuracy 0\.\d{4}`,
		`rank 0: finished, test accuracy 0\.\d{4}, parameter hash [0-9a-f]{16}`,
		`rank 1: finished, test accuracy 0\.\d{4}, parameter hash [0-9a-f]{16}`,
	} {
		if !regexp.MustCompile(re).MatchString(got) {
			t.Errorf("the screen lacks %s\n%s", re, tails(got))
		}
	}
	if strings.Contains(got, `"level":`) || strings.Contains(got, "listening on") {
		t.Errorf("log lines on the screen:\n%s", tails(got))
	}
	logs, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"peer":0,"level":"info"`, `{"peer":1,"level":"info"`, `"message":"summary"`, "listening on /ip4/127.0.0.1/"} {
		if !bytes.Contains(logs, []byte(want)) {
			t.Errorf("the log file lacks %s", want)
		}
	}
}

// TestLocalTrace: `local --trace` leaves one trace-event JSON file with
// every phase of every step for every peer, each named by its rank, the
// formation as an instant, on one clock; the peers' parts are gone.
func TestLocalTrace(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	job := `{"name": "trace", "world_size": 2, "epochs": 1, "batch_size": 32, "seed": 1, "model": "mlp",
		"data": "` + mustAbs(t, "../../testdata/data-config.json") + `", "join_timeout": "60s"}`
	cfg := filepath.Join(dir, "job.json")
	if err := os.WriteFile(cfg, []byte(job), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "trace.json")
	if log, err := ringtrain(t, 3*time.Minute, "local", "-n", "2", "--config", cfg, "--trace", out); err != nil {
		t.Fatalf("local: %v\n%s", err, tails(log))
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		TraceEvents []struct {
			Name, Ph string
			Pid      int
			Ts, Dur  float64
			Args     map[string]any
		}
	}
	if err := json.Unmarshal(b, &tr); err != nil {
		t.Fatalf("not JSON: %v", err)
	}
	seen := map[int]map[string]int{}
	names := map[int]string{}
	for _, e := range tr.TraceEvents {
		if seen[e.Pid] == nil {
			seen[e.Pid] = map[string]int{}
		}
		seen[e.Pid][e.Ph+" "+e.Name]++
		if e.Ph == "M" && e.Name == "process_name" {
			names[e.Pid], _ = e.Args["name"].(string)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("timelines of %d peers; want 2", len(seen))
	}
	for pid, got := range seen {
		steps := got["X optimizer"]
		if steps == 0 {
			t.Errorf("peer %d: no optimizer spans: %v", pid, got)
		}
		for _, phase := range []string{"X data", "X forward", "X backward", "X allreduce"} {
			if got[phase] != steps {
				t.Errorf("peer %d: %d %q spans for %d steps", pid, got[phase], phase, steps)
			}
		}
		if got["i ring formed"] != 1 || got["M process_name"] != 1 {
			t.Errorf("peer %d: %v", pid, got)
		}
	}
	if !(names[1] == "rank 0" && names[2] == "rank 1" || names[1] == "rank 1" && names[2] == "rank 0") {
		t.Errorf("timelines named %v; want rank 0 and rank 1", names)
	}
	if parts, _ := filepath.Glob(out + ".peer-*"); len(parts) != 0 {
		t.Errorf("parts left behind: %v", parts)
	}
}

// TestIsTerminal: a pseudo-terminal is a terminal; /dev/null, a character
// device too, is not, nor a pipe or a file. Before, any character device
// was taken for one, and `join … 2>/dev/null` from a terminal sent its
// result lines into a display nobody saw.
func TestIsTerminal(t *testing.T) {
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Skipf("no pseudo-terminal here: %v", err)
	}
	defer ptmx.Close()
	defer tty.Close()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	file, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	for _, c := range []struct {
		name string
		w    io.Writer
		want bool
	}{{"a pseudo-terminal", tty, true}, {"/dev/null", null, false}, {"a pipe", w, false}, {"a file", file, false}, {"a buffer", &bytes.Buffer{}, false}} {
		if got := isTerminal(c.w); got != c.want {
			t.Errorf("%s: isTerminal = %v; want %v", c.name, got, c.want)
		}
	}
}
