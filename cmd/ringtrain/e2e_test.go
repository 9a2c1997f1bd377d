package main

import (
	"bytes"
	"context"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	xdraw "golang.org/x/image/draw"
)

// The test binary stands in for ringtrain when `local` starts it as a peer.
func TestMain(m *testing.M) {
	if os.Getenv("RINGTRAIN_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// ringtrain runs the command as a separate process of this test binary.
func ringtrain(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, self, args...)
	cmd.Env = append(os.Environ(), "RINGTRAIN_TEST_AS_MAIN=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
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
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "3", "--config", cfg, "--log-format", "json")
	if err != nil {
		t.Fatalf("local: %v\n%s", err, out)
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
		t.Fatalf("summaries' param hashes %v; want three equal ones\n%s", hashes, out)
	}

	// predict, from the checkpoint rank 0 wrote, on a PNG (grayscale), a
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
	}
	for _, tt := range tests {
		out, err := ringtrain(t, time.Minute, "join", "--config", write(tt.name+".json", tt.body), "--log-format", "json")
		if err == nil || !strings.Contains(out, tt.words) {
			t.Errorf("%s: join exited %v with %q; want non-zero, naming %q", tt.name, err, out, tt.words)
		}
	}
}

// TestJoinUnreachableBootstrap: nobody listens at the bootstrap address; the
// join fails within its timeout and says so.
func TestJoinUnreachableBootstrap(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "job.json")
	os.WriteFile(cfg, []byte(`{"name": "j", "world_size": 2, "epochs": 1, "batch_size": 8, "model": "mlp", "join_timeout": "3s",
		"data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "`+mustAbs(t, "../../testdata/fashion-mnist")+`"}}}`), 0o644)
	start := time.Now()
	out, err := ringtrain(t, time.Minute, "join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0",
		"--bootstrap", "/ip4/127.0.0.1/tcp/1/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN")
	if err == nil || !strings.Contains(out, "no bootstrap peer") {
		t.Errorf("join with a dead bootstrap exited %v with %q; want non-zero saying no bootstrap peer answered", err, out)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("join took %v to give up; want about its 3 s timeout", d)
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

// TestLocalInterruptLeavesNoOrphans: Ctrl-C on `local` stops every peer, and
// local returns only once they are gone.
func TestLocalInterruptLeavesNoOrphans(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "job.json")
	// world_size 4 with 3 peers: they wait for a fourth that never comes.
	os.WriteFile(cfg, []byte(`{"name": "orphans", "world_size": 4, "epochs": 1, "batch_size": 8, "model": "mlp", "join_timeout": "5m",
		"data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "`+mustAbs(t, "../../testdata/fashion-mnist")+`"}}}`), 0o644)
	cmd := exec.Command(self, "local", "-n", "3", "--config", cfg)
	cmd.Env = append(os.Environ(), "RINGTRAIN_TEST_AS_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	pidRe := regexp.MustCompile(`started, pid (\d+)`)
	var pids []int
	looking := 0
	buf := make([]byte, 0, 1<<16)
	chunk := make([]byte, 4096)
	for looking < 3 {
		n, err := stdout.Read(chunk)
		if err != nil {
			t.Fatalf("local ended before its peers were all looking for each other: %v\n%s", err, buf)
		}
		buf = append(buf, chunk[:n]...)
		pids = pids[:0]
		for _, m := range pidRe.FindAllStringSubmatch(string(buf), -1) {
			p, _ := strconv.Atoi(m[1])
			pids = append(pids, p)
		}
		looking = strings.Count(string(buf), "looking for peers")
	}
	if len(pids) != 3 {
		t.Fatalf("found pids %v; want 3\n%s", pids, buf)
	}
	cmd.Process.Signal(os.Interrupt)
	go func() { io.Copy(io.Discard, stdout) }()
	if err := cmd.Wait(); err == nil {
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
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "job.json")
	os.WriteFile(cfg, []byte(`{"name": "sigint", "world_size": 2, "epochs": 100, "batch_size": 8, "model": "mlp", "checkpoint_dir": "`+dir+`",
		"data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "`+mustAbs(t, "../../testdata/fashion-mnist")+`"}}}`), 0o644)
	cmd := exec.Command(self, "local", "-n", "2", "--config", cfg)
	cmd.Env = append(os.Environ(), "RINGTRAIN_TEST_AS_MAIN=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var buf []byte
	chunk := make([]byte, 4096)
	for strings.Count(string(buf), `"steps":`) < 2 { // progress lines: the peers are training
		n, err := stdout.Read(chunk)
		if err != nil {
			t.Fatalf("local ended before training: %v\n%s", err, buf)
		}
		buf = append(buf, chunk[:n]...)
	}
	cmd.Process.Signal(os.Interrupt)
	rest, _ := io.ReadAll(stdout)
	buf = append(buf, rest...)
	cmd.Wait()
	out := string(buf)
	stopped := strings.Index(out, "interrupted: left the ring")
	if stopped < 0 || strings.LastIndex(out, `"message":"checkpoint written"`) < stopped {
		t.Fatalf("want peers to leave between steps and rank 0 to write a checkpoint after that:\n%s", out)
	}
	c, err := ringtrain(t, time.Minute, "predict", "--checkpoint", filepath.Join(dir, "sigint.ckpt"), "--image", "../../testdata/fashion-folder/test/Trouser/9965.png")
	if err != nil {
		t.Errorf("predict from the interrupt checkpoint: %v\n%s", err, c)
	}
}
