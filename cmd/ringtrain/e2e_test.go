package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	xdraw "golang.org/x/image/draw"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ringtrain/ringtrain/internal/ringbench"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// The test binary stands in for ringtrain when `local` starts it as a peer.
func TestMain(m *testing.M) {
	if os.Getenv("RINGTRAIN_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	train.InstallBLAS()
	os.Exit(m.Run())
}

// peerCommand is a ringtrain process for a test: the binary that
// RINGTRAIN_TEST_BIN names, where it is set — make test builds bin/ringtrain
// without the race detector for this, since peers under it train several
// times slower and the process tests are most of make test's time, while
// the same code runs under the race detector in-process in train/elastic,
// p2p and ring — or else this test binary standing in for ringtrain.
func peerCommand(ctx context.Context, t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	if bin := os.Getenv("RINGTRAIN_TEST_BIN"); bin != "" {
		return exec.CommandContext(ctx, bin, args...)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), "RINGTRAIN_TEST_AS_MAIN=1")
	return cmd
}

// ringtrain runs the command as a separate process (peerCommand).
func ringtrain(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	return ringtrainIn(t, "", timeout, args...)
}

// ringtrainIn is ringtrain run in the working directory dir ("" for this
// one).
func ringtrainIn(t *testing.T, dir string, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	skipShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := peerCommand(ctx, t, args...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestLocalTrainsEndToEnd: `ringtrain local -n 3` on testdata/ for one epoch
// exits 0, all three summaries carry the same param_hash, and accuracy is
// well above chance.
func TestLocalTrainsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	job, err := os.ReadFile("../../testdata/job.json")
	if err != nil {
		t.Fatal(err)
	}
	job = bytes.Replace(job, []byte(`"data": "data-config.json"`),
		[]byte(`"data": "`+mustAbs(t, "../../testdata/data-config.json")+`", "checkpoint_dir": "`+dir+`"`), 1)
	cfg := filepath.Join(dir, "job.json")
	os.WriteFile(cfg, job, 0o644)
	logs := filepath.Join(dir, "logs")
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "3", "--config", cfg, "--log-format", "json", "--metrics", "127.0.0.1:0", "--log-dir", logs)
	if err != nil {
		t.Fatalf("local: %v\n%s", err, tails(out))
	}
	// Each peer's log is in its file too, and plot draws the curves from them.
	files, _ := filepath.Glob(filepath.Join(logs, "peer-*.jsonl"))
	var plotOut bytes.Buffer
	if err := run(context.Background(), append(append([]string{"plot"}, files...), "-o", filepath.Join(dir, "curves.png")), &plotOut, &plotOut); err != nil ||
		len(files) != 3 || !strings.Contains(plotOut.String(), "of 3 ranks") {
		t.Errorf("plot of the peers' --log-dir files %v: %v %s", files, err, plotOut.String())
	}
	if n := strings.Count(out, "metrics on http://127.0.0.1:"); n != 3 {
		t.Errorf("%d peers serve metrics; want 3", n)
	}
	if n := regexp.MustCompile(`"share_compute":[0-9.]+,"share_wait":[0-9.]+,"share_ring":[0-9.]+`).FindAllString(out, -1); len(n) < 6 {
		t.Errorf("%d epoch and summary lines say where the time went; want 6 (3 peers × epoch done and summary)", len(n))
	}
	if n := regexp.MustCompile(`"rank_compute_s":\[[0-9.e-]+,[0-9.e-]+,[0-9.e-]+\],"stragglers":\[`).FindAllString(out, -1); len(n) != 3 {
		t.Errorf("%d epoch-done lines give the three ranks' compute times and the stragglers; want 3", len(n))
	}
	re := regexp.MustCompile(`"param_hash":"([0-9a-f]{64})".*"test_accuracy":([0-9.]+)|"test_accuracy":([0-9.]+).*"param_hash":"([0-9a-f]{64})"`)
	var hashes []string
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, `"message":"summary"`) {
			continue
		}
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("summary line without hash and accuracy: %s", line)
		}
		hash, acc := m[1]+m[4], m[2]+m[3]
		a, _ := strconv.ParseFloat(acc, 64)
		if a < 0.5 {
			t.Errorf("test accuracy %v; want well above chance (0.1)", a)
		}
		hashes = append(hashes, hash)
	}
	if len(hashes) != 3 || hashes[0] != hashes[1] || hashes[1] != hashes[2] {
		t.Fatalf("summaries' param hashes %v; want three equal ones\n%s", hashes, tails(out))
	}
	// Each rank scored a third of the 500 test images; each reports all 500.
	if n := strings.Count(out, `"test_samples":500,`); n != 3 {
		t.Errorf("%d summaries report 500 test samples; want 3 (sharded evaluation, counts summed)", n)
	}
	for r := range 3 {
		if want := fmt.Sprintf("[rank %d] rank %d of 3:", r, r); !strings.Contains(out, want) {
			t.Errorf("output lacks %q: lines are not prefixed with their rank", want)
		}
	}

	// Every peer with a checkpoint_dir writes its checkpoint and says so
	// (here all three into one dir, each by a rename of its own file).
	if n := strings.Count(out, "checkpoint: "); n != 3 {
		t.Errorf("%d peers print a checkpoint path; want all 3, which wrote it", n)
	}
	// predict, from the checkpoint the peers wrote, on a PNG (grayscale), a
	// JPEG (colour) and a colour image of another size.
	ckpt := filepath.Join(dir, "fashion-mnist-demo.ckpt")
	odd := filepath.Join(dir, "odd.png")
	writeOddImage(t, "../../testdata/fashion-folder/test/Trouser/9960.jpg", odd)
	for _, img := range []string{"../../testdata/fashion-folder/test/Trouser/9960.jpg", "../../testdata/fashion-folder/test/Trouser/9965.png", odd} {
		out, err := ringtrain(t, time.Minute, "predict", "--checkpoint", ckpt, "--image", img)
		if err != nil || !strings.Contains(out, img+": Trouser") {
			t.Errorf("predict %s: %v\n%s; want it to say Trouser", img, err, out)
		}
	}
}

// writeOddImage writes src as a 56×40 colour PNG.
func writeOddImage(t *testing.T, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	m, _, err := image.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	out := image.NewRGBA(image.Rect(0, 0, 40, 56))
	xdraw.BiLinear.Scale(out, out.Bounds(), m, m.Bounds(), xdraw.Src, nil)
	g, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := png.Encode(g, out); err != nil {
		t.Fatal(err)
	}
}

func TestJoinRefusesBadConfigs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(body), 0o644)
		return p
	}
	data := `"data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "` + mustAbs(t, "../../testdata/fashion-mnist") + `"}}`
	tests := []struct{ name, body, words string }{
		{"unknown field", `{"name": "j", "world_size": 1, "epochs": 1, "batch_size": 8, "model": "mlp", "epocs": 3, ` + data + `}`, `unknown field "epocs"`},
		{"missing dataset", `{"name": "j", "world_size": 1, "epochs": 1, "batch_size": 8, "model": "mlp", "data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "/nonexistent/fmnist"}}}`, "/nonexistent/fmnist"},
		{"unknown model", `{"name": "j", "world_size": 1, "epochs": 1, "batch_size": 8, "model": "resnet152", ` + data + `}`, `model "resnet152" is unknown`},
		{"no world size", `{"name": "j", "epochs": 1, "batch_size": 8, "model": "mlp", ` + data + `}`, `add "world_size"`},
		{"aliases disagree", `{"name": "j", "world_size": 2, "nodes": 3, "epochs": 1, "batch_size": 8, "model": "mlp", ` + data + `}`, "disagree"},
		// This binary has no CUDA: asking for a GPU names the build to use.
		{"gpus without CUDA", `{"name": "j", "world_size": 1, "gpus": 1, "epochs": 1, "batch_size": 8, "model": "mlp", ` + data + `}`, "built without CUDA: build the CUDA one with `make cuda`"},
		{"two gpus", `{"name": "j", "world_size": 1, "gpus": 2, "epochs": 1, "batch_size": 8, "model": "mlp", ` + data + `}`, "a peer drives one GPU"},
	}
	for _, tt := range tests {
		out, err := ringtrain(t, time.Minute, "join", "--config", write(tt.name+".json", tt.body), "--log-format", "json")
		if err == nil || !strings.Contains(out, tt.words) {
			t.Errorf("%s: join exited %v with %q; want non-zero, naming %q", tt.name, err, out, tt.words)
		}
	}
}

// TestDeviceFlag: --device cuda in a build without CUDA stops before the
// peer joins anything; --device host trains the mlp on ringtrain's own
// engine (the CUDA engine's logic, on the CPU) with two peers in step.
func TestDeviceFlag(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "device", "world_size": 2, "epochs": 1`)
	out, err := ringtrain(t, time.Minute, "join", "--config", cfg, "--device", "cuda", "--log-format", "json")
	if err == nil || !strings.Contains(out, "bin/ringtrain-cuda") || strings.Contains(out, "looking for peers") {
		t.Errorf("join --device cuda exited %v with %q; want an error naming bin/ringtrain-cuda before any peer search", err, out)
	}
	out, err = ringtrain(t, 3*time.Minute, "local", "-n", "2", "--config", cfg, "--device", "host")
	if err != nil {
		t.Fatalf("local --device host: %v\n%s", err, tails(out))
	}
	hashes := regexp.MustCompile(`"device":"host"|"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(out, -1)
	var devices, hs []string
	for _, m := range hashes {
		if m[1] == "" {
			devices = append(devices, m[0])
		} else {
			hs = append(hs, m[1])
		}
	}
	if len(devices) != 2 || len(hs) != 2 || hs[0] != hs[1] {
		t.Errorf("local --device host: %d peers said device host, hashes %v; want 2 and two equal hashes\n%s", len(devices), hs, tails(out))
	}
}

// TestJoinUnreachableBootstrap: nobody listens at the bootstrap address; the
// join fails within its timeout and says so.
func TestJoinUnreachableBootstrap(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "j", "world_size": 2, "epochs": 1, "join_timeout": "3s"`)
	start := time.Now()
	out, err := ringtrain(t, time.Minute, "join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN")
	if err == nil || !strings.Contains(out, "no bootstrap peer") {
		t.Errorf("join with a dead bootstrap exited %v with %q; want non-zero saying no bootstrap peer answered", err, out)
	}
	t.Logf("join gave up after %v (join_timeout 3s)", time.Since(start).Round(time.Millisecond))
}

// skipShort skips a test that starts processes under go test -short (make
// check); make test runs it.
func skipShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts ringtrain processes; make test runs it")
	}
}

func mustAbs(t *testing.T, p string) string {
	t.Helper()
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// started is a ringtrain process of this test binary with its combined
// output being read.
type started struct {
	cmd *exec.Cmd
	out io.Reader
	buf []byte
}

func startRingtrain(t *testing.T, args ...string) *started {
	t.Helper()
	skipShort(t)
	return startCmd(t, peerCommand(context.Background(), t, args...))
}

// startCmd starts cmd with its combined output being read; it is killed
// when the test ends.
func startCmd(t *testing.T, cmd *exec.Cmd) *started {
	t.Helper()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	return &started{cmd: cmd, out: out}
}

// until reads output until done says the output so far is enough.
func (s *started) until(t *testing.T, what string, done func(out string) bool) {
	t.Helper()
	// A process that goes quiet without ending would block Read forever:
	// past the deadline it is killed, which ends its output and the test.
	const deadline = 3 * time.Minute
	stop := time.AfterFunc(deadline, func() { s.cmd.Process.Kill() })
	defer stop.Stop()
	chunk := make([]byte, 4096)
	for !done(string(s.buf)) {
		n, err := s.out.Read(chunk)
		if err != nil {
			t.Fatalf("output ended before %s (killed if it took over %v): %v\n%s", what, deadline, err, tails(s.buf))
		}
		s.buf = append(s.buf, chunk[:n]...)
	}
}

// interrupt sends Ctrl-C, waits for the process, and returns all its output
// and its exit error.
func (s *started) interrupt() (string, error) {
	s.cmd.Process.Signal(os.Interrupt)
	// One that does not end after Ctrl-C is killed, so the test ends.
	stop := time.AfterFunc(2*time.Minute, func() { s.cmd.Process.Kill() })
	defer stop.Stop()
	rest, _ := io.ReadAll(s.out)
	s.buf = append(s.buf, rest...)
	return string(s.buf), s.cmd.Wait()
}

// jobFile writes a job config training on the testdata subset, with extra
// fields spliced in.
func writeJobFile(t *testing.T, dir, fields string) string {
	t.Helper()
	p := filepath.Join(dir, "job.json")
	body := `{` + fields + `, "batch_size": 8, "model": "mlp",
		"data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "` + mustAbs(t, "../../testdata/fashion-mnist") + `"}}}`
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestLocalInterruptLeavesNoOrphans: Ctrl-C on `local` stops every peer, and
// local returns only once they are gone.
func TestLocalInterruptLeavesNoOrphans(t *testing.T) {
	// Interrupted while they find each other or train (100 epochs: they
	// cannot have finished).
	cfg := writeJobFile(t, t.TempDir(), `"name": "orphans", "world_size": 3, "epochs": 100, "join_timeout": "5m"`)
	local := startRingtrain(t, "local", "-n", "3", "--config", cfg)
	local.until(t, "all peers look for each other", func(out string) bool { return strings.Count(out, "looking for peers") == 3 })
	var pids []int
	for _, m := range regexp.MustCompile(`started, pid (\d+)`).FindAllStringSubmatch(string(local.buf), -1) {
		p, _ := strconv.Atoi(m[1])
		pids = append(pids, p)
	}
	if len(pids) != 3 {
		t.Fatalf("found pids %v; want 3\n%s", pids, tails(local.buf))
	}
	if _, err := local.interrupt(); err == nil {
		t.Error("interrupted local exited 0; want non-zero")
	}
	for _, p := range pids {
		// Signal 0 probes for the process; the peers were our grandchildren
		// and local waited for them, so they are gone, not zombies of ours.
		if err := syscall.Kill(p, 0); err == nil {
			t.Errorf("peer pid %d still runs after local returned", p)
		}
	}
}

// TestInterruptWritesCheckpoint: Ctrl-C in the middle of training stops
// every peer between steps, and rank 0 leaves a checkpoint that loads.
func TestInterruptWritesCheckpoint(t *testing.T) {
	dir := t.TempDir()
	cfg := writeJobFile(t, dir, `"name": "sigint", "world_size": 2, "epochs": 100, "checkpoint_dir": "`+dir+`"`)
	local := startRingtrain(t, "local", "-n", "2", "--config", cfg)
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 2 }) // progress lines
	out, _ := local.interrupt()
	stopped := strings.Index(out, "interrupted: every peer stopped after the same step")
	if stopped < 0 || strings.LastIndex(out, `"message":"checkpoint written"`) < stopped {
		t.Fatalf("want peers to leave between steps and rank 0 to write a checkpoint after that:\n%s", tails(out))
	}
	// Both peers stop after the same step, whichever saw the signal first.
	var done []string
	for _, m := range regexp.MustCompile(`"steps_done":(\d+)[^\n]*every peer stopped`).FindAllStringSubmatch(out, -1) {
		done = append(done, m[1])
	}
	if len(done) != 2 || done[0] != done[1] {
		t.Errorf("steps done when stopped: %v; want the same on both peers\n%s", done, tails(out))
	}
	c, err := ringtrain(t, time.Minute, "predict", "--checkpoint", filepath.Join(dir, "sigint.ckpt"), "--image", "../../testdata/fashion-folder/test/Trouser/9965.png")
	if err != nil {
		t.Errorf("predict from the interrupt checkpoint: %v\n%s", err, tails(c))
	}
}

// TestKillAllAndRestartResumes: two peers write a checkpoint every 40 steps;
// both are SIGKILLed mid-run; started again, they resume from the last
// checkpoint (in the middle of an epoch) and end with the parameters of a
// run that was never stopped.
func TestKillAllAndRestartResumes(t *testing.T) {
	fields := `"name": "restart", "world_size": 2, "epochs": 4, "checkpoint_every": 40`
	hashOf := func(out string) string {
		var hs []string
		for _, m := range regexp.MustCompile(`"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(out, -1) {
			hs = append(hs, m[1])
		}
		if len(hs) != 2 || hs[0] != hs[1] {
			t.Fatalf("hashes %v; want two equal ones\n%s", hs, tails(out))
		}
		return hs[0]
	}
	straightDir := t.TempDir()
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "2", "--config",
		writeJobFile(t, straightDir, fields+`, "checkpoint_dir": "`+straightDir+`"`))
	if err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, tails(out))
	}
	want := hashOf(out)

	dir := t.TempDir()
	cfg := writeJobFile(t, dir, fields+`, "checkpoint_dir": "`+dir+`"`)
	first := startRingtrain(t, "local", "-n", "2", "--config", cfg)
	first.until(t, "a mid-epoch checkpoint", func(out string) bool {
		return strings.Contains(out, `"steps_done":80,`) && strings.Contains(out, "checkpoint written")
	})
	var pids []int
	for _, m := range regexp.MustCompile(`started, pid (\d+)`).FindAllStringSubmatch(string(first.buf), -1) {
		p, _ := strconv.Atoi(m[1])
		pids = append(pids, p)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	if out, err := first.interrupt(); err == nil || strings.Contains(out, `"message":"summary"`) {
		t.Fatalf("the killed run finished anyway (make it longer):\n%s", tails(out))
	}

	out, err = ringtrain(t, 3*time.Minute, "local", "-n", "2", "--config", cfg)
	if err != nil {
		t.Fatalf("restarted run: %v\n%s", err, tails(out))
	}
	if !strings.Contains(out, "resuming from a checkpoint") || strings.Count(out, `"samples_into_epoch":`) != 2 {
		t.Errorf("the restarted peers did not say they resumed:\n%s", tails(out))
	}
	if got := hashOf(out); got != want {
		t.Errorf("resumed run ends with %s; the uninterrupted one with %s", got, want)
	}
	// A finished run's checkpoint is not trained on again, nor overwritten.
	out, err = ringtrain(t, time.Minute, "local", "-n", "2", "--config", cfg)
	if err == nil || !strings.Contains(out, "is of a finished run (4 of 4 epochs)") {
		t.Errorf("a third start over a finished checkpoint: %v; want an error saying so\n%s", err, tails(out))
	}
}

// TestLosingAPeerMidTraining: three peers with min_world_size 2; one is
// SIGKILLed in the middle of training; the other two re-form the ring
// (generation 2), say so, finish every epoch and end with the same
// parameters.
func TestLosingAPeerMidTraining(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "elastic", "world_size": 3, "min_world_size": 2, "epochs": 4, "step_timeout": "10s"`)
	local := startRingtrain(t, "local", "-n", "3", "--config", cfg)
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 3 })
	m := regexp.MustCompile(`\[peer 2\] started, pid (\d+)`).FindStringSubmatch(string(local.buf))
	if m == nil {
		t.Fatalf("no pid for peer 2:\n%s", tails(local.buf))
	}
	pid, _ := strconv.Atoi(m[1])
	syscall.Kill(pid, syscall.SIGKILL)
	rest, _ := io.ReadAll(local.out)
	out := string(append(local.buf, rest...))
	local.cmd.Wait() // non-zero: a peer was killed
	if strings.Count(out, "ring re-formed: rank ") != 2 || !strings.Contains(out, `"generation":2`) {
		t.Errorf("want both survivors to say the ring re-formed in generation 2:\n%s", tails(out))
	}
	var hashes []string
	for _, m := range regexp.MustCompile(`"world_size":2,"epochs":4,.*"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(out, -1) {
		hashes = append(hashes, m[1])
	}
	if len(hashes) != 2 || hashes[0] != hashes[1] {
		t.Errorf("survivors' summaries: hashes %v; want two equal ones, of a world of 2 after 4 epochs\n%s", hashes, tails(out))
	}
}

// TestCtrlCOnOnePeerLetsOthersGoOn: with min_world_size 2 of 3, Ctrl-C on
// one peer makes it leave after its next step, and the other two re-form
// at once (no timeout: they are told) and finish in step. The leave is a
// leave: the leaver's last frames reach the others (its links are drained,
// not dropped), it exits 0, and nobody calls it lost or runs a step again.
func TestCtrlCOnOnePeerLetsOthersGoOn(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "leave", "world_size": 3, "min_world_size": 2, "epochs": 4`)
	local := startRingtrain(t, "local", "-n", "3", "--config", cfg)
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 3 })
	m := regexp.MustCompile(`\[peer 1\] started, pid (\d+)`).FindStringSubmatch(string(local.buf))
	if m == nil {
		t.Fatalf("no pid for peer 1:\n%s", tails(local.buf))
	}
	pid, _ := strconv.Atoi(m[1])
	syscall.Kill(pid, syscall.SIGINT)
	rest, _ := io.ReadAll(local.out)
	out := string(append(local.buf, rest...))
	if err := local.cmd.Wait(); err != nil {
		t.Errorf("local: %v; want every peer to end well, the leaver too\n%s", err, tails(out))
	}
	if strings.Count(out, "peers are leaving; re-forming the ring without them") != 2 ||
		strings.Count(out, "ring re-formed without the peers that left; carrying on") != 2 || strings.Count(out, ", 1 peer(s) left") != 2 {
		t.Errorf("want both others to re-form without the leaver, and say it left:\n%s", tails(out))
	}
	// A leave is not a loss: nobody says so, and no step runs again.
	if strings.Contains(out, "lost") || strings.Contains(out, "running the step again") || strings.Contains(out, "exit status") {
		t.Errorf("the leave was taken for a loss:\n%s", tails(out))
	}
	if !strings.Contains(out, "left the job after ") {
		t.Errorf("the leaver does not say it left:\n%s", tails(out))
	}
	var hashes []string
	for _, m := range regexp.MustCompile(`"world_size":2,"epochs":4,.*"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(out, -1) {
		hashes = append(hashes, m[1])
	}
	if len(hashes) != 2 || hashes[0] != hashes[1] {
		t.Errorf("the two that stayed: hashes %v; want two equal ones\n%s", hashes, tails(out))
	}
}

// TestReplacementIsAdmitted: three peers (min_world_size 2) lose one; a new
// peer started then waits as a standby, is admitted at a step boundary, catches
// up, and the three end the job with the same parameters.
func TestReplacementIsAdmitted(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "replace", "world_size": 3, "min_world_size": 2, "epochs": 6`)
	local := startRingtrain(t, "local", "-n", "3", "--config", cfg)
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 3 })
	buf := string(local.buf)
	m := regexp.MustCompile(`\[peer 2\] started, pid (\d+)`).FindStringSubmatch(buf)
	a := regexp.MustCompile(`\[(?:peer|rank) \d\] listening on (/ip4/127\.0\.0\.1/\S+)`).FindStringSubmatch(buf)
	if m == nil || a == nil {
		t.Fatalf("no pid or address:\n%s", tails(buf))
	}
	pid, _ := strconv.Atoi(m[1])
	syscall.Kill(pid, syscall.SIGKILL)
	local.until(t, "re-formation", func(out string) bool { return strings.Count(out, "ring re-formed: rank ") == 2 })
	out, err := ringtrain(t, 3*time.Minute, "join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", a[1], "--log-format", "json")
	if err != nil {
		t.Fatalf("the replacement: %v\n%s", err, tails(out))
	}
	if !strings.Contains(out, "waiting as a standby") || !strings.Contains(out, "admitted to the ring") {
		t.Errorf("the replacement did not say it waited and was admitted:\n%s", tails(out))
	}
	rest, _ := io.ReadAll(local.out)
	all := string(append(local.buf, rest...)) + out
	local.cmd.Wait()
	var hashes []string
	for _, m := range regexp.MustCompile(`"world_size":3,"epochs":6,.*"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(all, -1) {
		hashes = append(hashes, m[1])
	}
	if len(hashes) != 3 || hashes[0] != hashes[1] || hashes[1] != hashes[2] {
		t.Errorf("summaries of the grown ring: hashes %v; want three equal ones\n%s", hashes, tails(all))
	}
}

// TestStandbyExitsZeroWhenTheJobEnds: a peer that joins a full ring waits
// as a standby; when the job finishes, the members tell it so, and it
// exits 0 at once, saying so, rather than waiting out its join timeout and
// failing.
func TestStandbyExitsZeroWhenTheJobEnds(t *testing.T) {
	cfg := writeJobFile(t, t.TempDir(), `"name": "full", "world_size": 2, "epochs": 6, "join_timeout": "5m"`)
	local := startRingtrain(t, "local", "-n", "2", "--config", cfg)
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 2 })
	a := regexp.MustCompile(`\[(?:peer|rank) \d\] listening on (/ip4/127\.0\.0\.1/\S+)`).FindStringSubmatch(string(local.buf))
	if a == nil {
		t.Fatalf("no address:\n%s", tails(string(local.buf)))
	}
	began := time.Now()
	out, err := ringtrain(t, 3*time.Minute, "join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", a[1], "--log-format", "json")
	local.cmd.Wait()
	if err != nil || !strings.Contains(out, "waiting as a standby") || !strings.Contains(out, "the job ended while this peer waited to be admitted") {
		t.Fatalf("the standby: %v; want exit 0, having waited and been told the job ended\n%s", err, tails(out))
	}
	if took := time.Since(began); took > 2*time.Minute {
		t.Errorf("the standby took %v to end; the job's end should reach it at once", took)
	}
}

// TestLocalFirstPeerFailsEarly: when peer 0 fails before it prints its
// address (here: its data cannot be loaded) and the job would let the
// others go on without it (min_world_size 1), local stops with peer 0's
// error instead of waiting for an address that never comes.
func TestLocalFirstPeerFailsEarly(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "job.json")
	os.WriteFile(filepath.Join(dir, "data.json"), []byte(`{"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "nowhere"}}`), 0o644)
	os.WriteFile(cfg, []byte(`{"name": "early", "world_size": 3, "min_world_size": 1, "epochs": 1, "batch_size": 8,
		"model": "mlp", "optimizer": {"name": "sgd", "lr": 0.05}, "data": "data.json"}`), 0o644)
	start := time.Now()
	out, err := ringtrain(t, 2*time.Minute, "local", "-n", "3", "--config", cfg)
	if err == nil || !strings.Contains(out, "peer 0") || !strings.Contains(out, "nowhere") {
		t.Fatalf("local with a broken first peer: %v\n%s", err, tails(out))
	}
	if strings.Contains(out, "[peer 1]") {
		t.Errorf("local started other peers after peer 0 failed:\n%s", tails(out))
	}
	t.Logf("local gave up after %v", time.Since(start).Round(time.Millisecond))
}

// TestPredictRecipe: CONFIG.md's recipe — train testdata/predict-job.json,
// whose checkpoint_dir is relative to the working directory, then predict
// from the checkpoint it leaves there — works as written.
func TestPredictRecipe(t *testing.T) {
	wd := t.TempDir()
	cfg := mustAbs(t, "../../testdata/predict-job.json")
	if out, err := ringtrainIn(t, wd, 3*time.Minute, "local", "-n", "2", "--config", cfg); err != nil {
		t.Fatalf("local: %v\n%s", err, tails(out))
	}
	img := mustAbs(t, "../../testdata/fashion-folder/test/Bag/9969.jpg")
	out, err := ringtrainIn(t, wd, time.Minute, "predict", "--checkpoint", "ckpt/fashion-mnist-predict.ckpt", "--image", img)
	if err != nil || !strings.Contains(out, "9969.jpg: ") {
		t.Errorf("predict from the recipe's checkpoint: %v\n%s", err, tails(out))
	}
}

// TestBenchAllreduceProcs: `bench allreduce --procs` runs each rank as its
// own process (the row a median of rounds as long as their slowest rank),
// and refuses transports other than plain TCP.
func TestBenchAllreduceProcs(t *testing.T) {
	out, err := ringtrain(t, time.Minute, "bench", "allreduce", "--procs", "--peers", "3", "--sizes", "64KiB,256KiB", "--iters", "2", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, tails(out))
	}
	var rows []ringbench.Result
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var r ringbench.Result
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("%v in %q", err, out)
		}
		rows = append(rows, r)
	}
	if len(rows) != 2 || rows[0].Bytes != 64<<10 || rows[1].Bytes != 256<<10 {
		t.Fatalf("rows %+v; want 64 KiB and 256 KiB", rows)
	}
	for _, r := range rows {
		if r.Transport != "tcp-procs" || r.Peers != 3 || r.Seconds <= 0 || r.Busbw <= 0 || r.CPUPerGB <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	// The TLS plane, every rank its own process and libp2p host.
	out, err = ringtrain(t, time.Minute, "bench", "allreduce", "--procs", "--transport", "tls", "--peers", "2", "--sizes", "64KiB", "--iters", "2", "--json")
	if err != nil || !strings.Contains(out, `"transport":"tls-procs","peers":2,"bytes":65536`) {
		t.Errorf("--procs over the TLS plane: %v\n%s", err, tails(out))
	}
	// Calls timed back to back after one barrier, as nccl-tests does.
	out, err = ringtrain(t, time.Minute, "bench", "allreduce", "--procs", "--transport", "tls", "--peers", "2", "--sizes", "64KiB", "--iters", "3", "--loop", "--json")
	if err != nil || !strings.Contains(out, `"transport":"tls-procs-loop","peers":2,"bytes":65536`) {
		t.Errorf("--procs --loop over the TLS plane: %v\n%s", err, tails(out))
	}
	for _, args := range [][]string{{"--procs", "--transport", "mem"}, {"--procs", "--netns", "x", "--subnet", "x", "--transport", "tcp"}, {"--netns", "x", "--subnet", "x", "--transport", "tcp"}, {"--procs", "--netns", "x", "--transport", "tls"}, {"--loop", "--transport", "tcp"}} {
		if out, err := ringtrain(t, time.Minute, append([]string{"bench", "allreduce"}, args...)...); err == nil || !strings.Contains(out, "usage") {
			t.Errorf("bench allreduce %v: %v, %s; want a usage error", args, err, out)
		}
	}
}

// paramHashes are the param_hash fields of the summaries in out.
func paramHashes(out string) []string {
	var hs []string
	for _, m := range regexp.MustCompile(`"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(out, -1) {
		hs = append(hs, m[1])
	}
	return hs
}

// TestServedDataTrainsAsLocalFiles is the Ember workflow: one data node
// (ringtrain serve), a first peer with a job config that names the served
// dataset, and a peer with nothing but --job name@hash and the data node's
// address. They end with the parameters that training on local files
// gives; a dataset or a job nobody serves is an error within the timeout.
func TestServedDataTrainsAsLocalFiles(t *testing.T) {
	dir := t.TempDir()
	fields := `"world_size": 2, "epochs": 1, "batch_size": 16, "seed": 3, "model": "mlp", "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9}`
	local := filepath.Join(dir, "local.json")
	os.WriteFile(local, []byte(`{"name": "local", `+fields+`, "data": "`+mustAbs(t, "../../testdata/data-config.json")+`"}`), 0o644)
	out, err := ringtrain(t, 2*time.Minute, "local", "-n", "2", "--config", local)
	want := paramHashes(out)
	if err != nil || len(want) != 2 || want[0] != want[1] {
		t.Fatalf("local files: %v, hashes %v\n%s", err, want, tails(out))
	}

	srv := startRingtrain(t, "serve", "--data", "../../testdata/data-config.json", "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json")
	idRe := regexp.MustCompile(`serving dataset ([0-9a-f]{64})`)
	srv.until(t, "the dataset's ID", func(out string) bool { return idRe.MatchString(out) })
	id := idRe.FindStringSubmatch(string(srv.buf))[1]
	addr := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(string(srv.buf))[1]
	if !strings.Contains(string(srv.buf), "transforms: ToTensor() → Normalize") || !strings.Contains(string(srv.buf), "Ankle boot=200") {
		t.Fatalf("serve should say what it serves, as Ember's server did:\n%s", tails(srv.buf))
	}

	served := filepath.Join(dir, "served.json")
	os.WriteFile(served, []byte(`{"name": "served", `+fields+`, "data": {"served": "`+id+`"}, "request_size": 50}`), 0o644)
	first := startRingtrain(t, "join", "--config", served, "--bootstrap", addr, "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json")
	refRe := regexp.MustCompile(`join --job (\S+)`)
	first.until(t, "the job's name@hash", func(out string) bool { return refRe.MatchString(out) })
	ref := refRe.FindStringSubmatch(string(first.buf))[1]
	second, err := ringtrain(t, 2*time.Minute, "join", "--job", ref, "--bootstrap", addr, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--log-format", "json", "--cache-dir", filepath.Join(dir, "cache"))
	rest, _ := io.ReadAll(first.out)
	firstOut := string(append(first.buf, rest...))
	if werr := first.cmd.Wait(); err != nil || werr != nil {
		t.Fatalf("served: %v / %v\n%s\n%s", werr, err, tails(firstOut), tails(second))
	}
	got := append(paramHashes(firstOut), paramHashes(second)...)
	if len(got) != 2 || got[0] != want[0] || got[1] != want[0] {
		t.Fatalf("served data: hashes %v; want local files' %s\n%s\n%s", got, want[0], tails(firstOut), tails(second))
	}
	if !strings.Contains(second, `"fetched the job config"`) || !strings.Contains(second, `"message":"served data"`) {
		t.Fatalf("the --job peer should say it fetched the config and the data:\n%s", tails(second))
	}
	// The cache holds what the peer fetched.
	if fi, err := os.Stat(filepath.Join(dir, "cache", id+".train")); err != nil || fi.Size() != 2000*784 {
		t.Fatalf("cache file: %v, %v; want 2000 samples of 784 bytes", fi, err)
	}

	// local, pointed at the data node, does the same with N processes.
	out, err = ringtrain(t, 2*time.Minute, "local", "-n", "2", "--config", served, "--bootstrap", addr)
	if got := paramHashes(out); err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[0] {
		t.Fatalf("local on served data: %v, hashes %v; want local files' %s\n%s", err, got, want[0], tails(out))
	}

	for _, c := range []struct{ name, want string }{
		{"a dataset nobody serves", "no server of the dataset"},
		{"a job nobody runs", "no peer handed out the job config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"join", "--bootstrap", addr, "--listen", "/ip4/127.0.0.1/tcp/0", "--join-timeout", "2s"}
			if strings.Contains(c.name, "dataset") {
				nobody := filepath.Join(dir, "nobody.json")
				os.WriteFile(nobody, []byte(`{"name": "nobody", `+fields+`, "data": {"served": "`+strings.Repeat("5", 64)+`"}}`), 0o644)
				args = append(args, "--config", nobody)
			} else {
				args = append(args, "--job", "served@"+strings.Repeat("7", 64))
			}
			start := time.Now()
			out, err := ringtrain(t, time.Minute, args...)
			if err == nil || !strings.Contains(out, c.want) || time.Since(start) > 30*time.Second {
				t.Fatalf("after %v: %v; want an error saying %q\n%s", time.Since(start), err, c.want, tails(out))
			}
		})
	}
	srv.interrupt()
}

// TestRestartedPeerIsWelcome: of three peers (min_world_size 2), each with
// its own identity, one is SIGKILLed; the other two re-form. Started again
// with the same identity on the same address, it does not take the first
// ring's statements, which others may still pass on, for a ring to form
// (before, it formed that ring again and died waiting for a link from a
// peer that had moved on): it hears that generation 2 trains without it
// and waits as a standby; it is admitted at a step boundary, and the three
// finish with the same parameters.
func TestRestartedPeerIsWelcome(t *testing.T) {
	dir := t.TempDir()
	cfg := writeJobFile(t, dir, `"name": "return", "world_size": 3, "min_world_size": 2, "epochs": 10`)
	join := func(i int, listen string, boot ...string) *started {
		args := []string{"join", "--config", cfg, "--identity", filepath.Join(dir, fmt.Sprintf("id-%d", i)), "--listen", listen, "--log-format", "json"}
		for _, b := range boot {
			args = append(args, "--bootstrap", b)
		}
		return startRingtrain(t, args...)
	}
	addrRe := regexp.MustCompile(`listening on (/ip4/127\.0\.0\.1/tcp/(\d+)/p2p/\S+)`)
	first := join(0, "/ip4/127.0.0.1/tcp/0")
	first.until(t, "its address", func(out string) bool { return addrRe.MatchString(out) })
	boot := addrRe.FindStringSubmatch(string(first.buf))[1]
	second := join(1, "/ip4/127.0.0.1/tcp/0", boot)
	third := join(2, "/ip4/127.0.0.1/tcp/0", boot)
	third.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 1 })
	port := addrRe.FindStringSubmatch(string(third.buf))[2]
	third.cmd.Process.Kill()
	third.cmd.Wait()
	first.until(t, "re-formation", func(out string) bool { return strings.Contains(out, "ring re-formed: rank ") })
	again := join(2, "/ip4/127.0.0.1/tcp/"+port, boot)
	again.until(t, "a standby, or a ring", func(out string) bool {
		return strings.Contains(out, "waiting as a standby") || strings.Contains(out, `"message":"ring formed"`) || strings.Contains(out, "ringtrain:")
	})
	outs, back := endTogether(t, []*started{first, second}, again)
	if strings.Contains(back, `"message":"ring formed"`) || !strings.Contains(back, "waiting as a standby") || !strings.Contains(back, "admitted to the ring") {
		t.Errorf("the restarted peer should wait as a standby and be admitted, not form a ring:\n%s", tails(back))
	}
	sameHashAtTheEnd(t, append(outs, back))
}

// endTogether waits for the others' processes to end, and then (a
// minute at most: a standby never admitted would wait out its join
// timeout) for again's, and returns what each wrote.
func endTogether(t *testing.T, others []*started, again *started) ([]string, string) {
	t.Helper()
	outs := make([]string, len(others))
	var wg sync.WaitGroup
	for i, p := range others {
		wg.Go(func() {
			rest, _ := io.ReadAll(p.out)
			p.cmd.Wait()
			outs[i] = string(append(p.buf, rest...))
		})
	}
	wg.Wait()
	stuck := time.AfterFunc(time.Minute, func() { again.cmd.Process.Kill() })
	rest, _ := io.ReadAll(again.out)
	again.cmd.Wait()
	stuck.Stop()
	return outs, string(append(again.buf, rest...))
}

// sameHashAtTheEnd checks that every output ends a 10-epoch job with one
// parameter hash.
func sameHashAtTheEnd(t *testing.T, outs []string) {
	t.Helper()
	var hashes []string
	for _, m := range regexp.MustCompile(`"epochs":10,.*"param_hash":"([0-9a-f]{64})"`).FindAllStringSubmatch(strings.Join(outs, "\n"), -1) {
		hashes = append(hashes, m[1])
	}
	if len(hashes) != len(outs) || slices.ContainsFunc(hashes, func(h string) bool { return h != hashes[0] }) {
		t.Errorf("hashes %v; want %d equal ones\n%s", hashes, len(outs), tails(strings.Join(outs, "\n")))
	}
}

// TestRestartedPeerRemembersTheJob: a peer of a ring keeps the members'
// addresses beside its identity; SIGKILLed and started again with the
// same identity but a bootstrap peer that is gone (as, in a job that
// churns for hours, every peer first named may be), it finds the job
// through them, is admitted, and ends with the others' parameters.
// Before, it waited out its join timeout and exited 1.
func TestRestartedPeerRemembersTheJob(t *testing.T) {
	dir := t.TempDir()
	cfg := writeJobFile(t, dir, `"name": "remember", "world_size": 3, "min_world_size": 2, "epochs": 10, "join_timeout": "20s"`)
	join := func(i int, listen string, boot ...string) *started {
		args := []string{"join", "--config", cfg, "--identity", filepath.Join(dir, fmt.Sprintf("id-%d", i)), "--listen", listen, "--log-format", "json"}
		for _, b := range boot {
			args = append(args, "--bootstrap", b)
		}
		return startRingtrain(t, args...)
	}
	addrRe := regexp.MustCompile(`listening on (/ip4/127\.0\.0\.1/tcp/(\d+)/p2p/(\S+))`)
	first := join(0, "/ip4/127.0.0.1/tcp/0")
	first.until(t, "its address", func(out string) bool { return addrRe.MatchString(out) })
	boot := addrRe.FindStringSubmatch(string(first.buf))
	second := join(1, "/ip4/127.0.0.1/tcp/0", boot[1])
	third := join(2, "/ip4/127.0.0.1/tcp/0", boot[1])
	third.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 1 })
	port := addrRe.FindStringSubmatch(string(third.buf))[2]
	third.cmd.Process.Kill()
	third.cmd.Wait()
	remembered, err := os.ReadFile(filepath.Join(dir, "id-2.peers"))
	if err != nil || !strings.Contains(string(remembered), boot[3]) {
		t.Fatalf("the peers remembered: %q, %v; want the first peer's address among them", remembered, err)
	}
	first.until(t, "re-formation", func(out string) bool { return strings.Contains(out, "ring re-formed: rank ") })
	// A bootstrap peer that is gone: the first peer's ID at a port
	// nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s", l.Addr().(*net.TCPAddr).Port, boot[3])
	l.Close()
	again := join(2, "/ip4/127.0.0.1/tcp/"+port, gone)
	outs, back := endTogether(t, []*started{first, second}, again)
	if !strings.Contains(back, "admitted to the ring") {
		t.Fatalf("the restarted peer, its bootstrap peer gone, was not admitted:\n%s", tails(back))
	}
	sameHashAtTheEnd(t, append(outs, back))
}

// tailLines is how many of each peer's last lines a failing test prints.
const tailLines = 25

// tails is the output of local (or of several processes) as a failing
// test prints it: the last tailLines lines of each peer — the lines with
// one prefix, "[peer i] " or "[rank r] " — and of what has none.
func tails(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		s = fmt.Sprint(v)
	}
	var order []string
	byPeer := map[string][]string{}
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		who := ""
		if strings.HasPrefix(l, "[") {
			if i := strings.Index(l, "] "); i > 0 && i < 12 {
				who = l[:i+1]
			}
		}
		if _, ok := byPeer[who]; !ok {
			order = append(order, who)
		}
		byPeer[who] = append(byPeer[who], l)
	}
	var b strings.Builder
	for _, who := range order {
		lines := byPeer[who]
		if len(lines) > tailLines {
			fmt.Fprintf(&b, "… %d earlier lines of %s\n", len(lines)-tailLines, cmp.Or(who, "the rest"))
			lines = lines[len(lines)-tailLines:]
		}
		b.WriteString(strings.Join(lines, "\n") + "\n")
	}
	return b.String()
}

// TestGPTTrainsEndToEnd: a byte-level GPT on a text corpus, on two peers:
// both end with one parameter hash, and the validation loss, in bits per
// byte, far below the 8 bits of a byte no model predicts.
func TestGPTTrainsEndToEnd(t *testing.T) {
	dir := t.TempDir()
	job, err := os.ReadFile("../../testdata/gpt-job.json")
	if err != nil {
		t.Fatal(err)
	}
	job = bytes.Replace(job, []byte(`"folder": "text"`), []byte(`"folder": "`+mustAbs(t, "../../testdata/text")+`"`), 1)
	job = bytes.Replace(job, []byte(`"seed": 1,`), []byte(`"seed": 1, "checkpoint_dir": "`+dir+`",`), 1)
	cfg := filepath.Join(dir, "job.json")
	if err := os.WriteFile(cfg, job, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "2", "--config", cfg, "--log-format", "json")
	if err != nil {
		t.Fatalf("local: %v\n%s", err, tails(out))
	}
	re := regexp.MustCompile(`"test_bits_per_byte":([0-9.]+).*"param_hash":"([0-9a-f]{64})"`)
	hashes := map[string]bool{}
	summaries := 0
	for _, line := range strings.Split(out, "\n") {
		if !strings.Contains(line, `"message":"summary"`) {
			continue
		}
		summaries++
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("summary line without bits per byte and hash: %s", line)
		}
		if bpb, _ := strconv.ParseFloat(m[1], 64); !(bpb < 5) {
			t.Errorf("validation loss %v bits per byte; want well under 8 (a uniform guess)", bpb)
		}
		hashes[m[2]] = true
	}
	if summaries != 2 || len(hashes) != 1 {
		t.Errorf("%d summaries with %d parameter hashes; want 2 with one\n%s", summaries, len(hashes), tails(out))
	}
	// The line a user reads gives a language model's score as it is compared.
	if n := len(regexp.MustCompile(`rank [01] of 2: validation \d\.\d{3} bits per byte \(next-byte accuracy 0\.\d{4}\), param hash`).FindAllString(out, -1)); n != 2 {
		t.Errorf("%d summary lines in bits per byte; want 2\n%s", n, tails(out))
	}
	// Text from the checkpoint: the prompt, then the bytes asked for, the
	// same for the same seed.
	ckpt := filepath.Join(dir, "gpt-tiny.ckpt")
	gen := func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(context.Background(), append([]string{"generate", "--checkpoint", ckpt}, args...), &out, &out)
		return out.String(), err
	}
	a, errA := gen("--prompt", "The ", "--tokens", "40", "--seed", "7")
	b, errB := gen("--prompt", "The ", "--tokens", "40", "--seed", "7")
	if errA != nil || errB != nil || a != b || len(a) != len("The ")+40+1 || !strings.HasPrefix(a, "The ") {
		t.Errorf("generate: %q (%v) and %q (%v); want the prompt and 40 bytes, twice alike", a, errA, b, errB)
	}
	if g, err := gen("--prompt", "x", "--tokens", "5", "--temperature", "0"); err != nil || len(g) != 7 {
		t.Errorf("greedy generate: %q, %v", g, err)
	}
	if _, err := gen("--prompt", strings.Repeat("y", 33)); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "context is 32") {
		t.Errorf("a prompt past the context: %v; want a usage error naming the context", err)
	}
}

// TestServedTextTrainsAsLocalFiles: a text corpus served by `ringtrain
// serve` (its parts in hashed chunks) trains a GPT on two peers to the
// parameters the same job reaches on the local files.
func TestServedTextTrainsAsLocalFiles(t *testing.T) {
	dir := t.TempDir()
	text := mustAbs(t, "../../testdata/text")
	fields := `"world_size": 2, "epochs": 1, "batch_size": 8, "seed": 3, "model": {"gpt": {"layers": 1, "dim": 16, "heads": 2, "context": 16}}, "optimizer": {"name": "adamw", "lr": 3e-3}`
	local := filepath.Join(dir, "local.json")
	os.WriteFile(local, []byte(`{"name": "local", `+fields+`, "data": {"text": {"folder": "`+text+`"}}}`), 0o644)
	out, err := ringtrain(t, 2*time.Minute, "local", "-n", "2", "--config", local)
	want := paramHashes(out)
	if err != nil || len(want) != 2 || want[0] != want[1] {
		t.Fatalf("local files: %v, hashes %v\n%s", err, want, tails(out))
	}
	dataCfg := filepath.Join(dir, "data.json")
	os.WriteFile(dataCfg, []byte(`{"text": {"folder": "`+text+`"}}`), 0o644)
	srv := startRingtrain(t, "serve", "--data", dataCfg, "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json")
	idRe := regexp.MustCompile(`serving dataset ([0-9a-f]{64})`)
	srv.until(t, "the dataset's ID", func(out string) bool { return idRe.MatchString(out) })
	id := idRe.FindStringSubmatch(string(srv.buf))[1]
	addr := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(string(srv.buf))[1]
	served := filepath.Join(dir, "served.json")
	os.WriteFile(served, []byte(`{"name": "served", `+fields+`, "data": {"served": "`+id+`"}}`), 0o644)
	out, err = ringtrain(t, 2*time.Minute, "local", "-n", "2", "--config", served, "--bootstrap", addr)
	if got := paramHashes(out); err != nil || len(got) != 2 || got[0] != want[0] || got[1] != want[0] {
		t.Fatalf("served text: %v, hashes %v; want local files' %s\n%s", err, got, want[0], tails(out))
	}
	srv.interrupt()
}

// TestFirstPeerDoesNotWaitForRememberedPeers: a peer started with no
// --bootstrap — a new job's first — whose identity remembers the peers of
// a job that has ended listens at once, rather than waiting out the join
// timeout for them and failing.
func TestFirstPeerDoesNotWaitForRememberedPeers(t *testing.T) {
	dir := t.TempDir()
	cfg := writeJobFile(t, dir, `"name": "fresh", "world_size": 2, "epochs": 1, "join_timeout": "5s"`)
	other, err := p2p.LoadOrCreateIdentity(filepath.Join(dir, "other"))
	if err != nil {
		t.Fatal(err)
	}
	otherID, err := peer.IDFromPrivateKey(other)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := fmt.Sprintf("/ip4/127.0.0.1/tcp/%d/p2p/%s\n", l.Addr().(*net.TCPAddr).Port, otherID)
	l.Close()
	id := filepath.Join(dir, "id-0")
	if err := os.WriteFile(id+".peers", []byte(gone), 0o600); err != nil {
		t.Fatal(err)
	}
	first := startRingtrain(t, "join", "--config", cfg, "--identity", id, "--listen", "/ip4/127.0.0.1/tcp/0", "--log-format", "json")
	first.until(t, "its address", func(out string) bool { return strings.Contains(out, "listening on /ip4/127.0.0.1/") })
	first.interrupt()
}
