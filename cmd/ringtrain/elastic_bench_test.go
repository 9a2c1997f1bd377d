//go:build bench

package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchElastic is a benchmark, not a test: it asserts nothing, so it
// is built only with -tags bench (make bench-elastic) and prints its
// figures. With 4 peers of `local` on the full Fashion-MNIST (testdata's
// subset where it is not installed), 5 runs each and their median:
//
//  1. SIGKILL of one peer → the survivors' first completed step in the new
//     generation (the slowest survivor's), min_world_size 3;
//  2. Ctrl-C (SIGINT) of one peer, which leaves → the same;
//  3. a fifth peer started with `join` (max_world_size 5) → the members'
//     first completed step in the ring grown with it.
//
// Then, with the full Fashion-MNIST: test accuracy of a 3-epoch mlp run of 4
// peers that loses one in epoch 2, against the same run uninterrupted.
func TestBenchElastic(t *testing.T) {
	dir := t.TempDir()
	pidOf := func(out string, peer int) int {
		m := regexp.MustCompile(fmt.Sprintf(`\[peer %d\] started, pid (\d+)`, peer)).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no pid for peer %d:\n%s", peer, tails(out))
		}
		p, _ := strconv.Atoi(m[1])
		return p
	}
	data := mustAbs(t, "../../testdata/fashion-mnist")
	if _, err := os.Stat("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); err == nil {
		data = "/usr/share/datasets/fashion-mnist"
	}
	eventJob := func(name string) string {
		p := filepath.Join(dir, name+".json")
		body := `{"name": "` + name + `", "world_size": 4, "min_world_size": 3, "max_world_size": 5, "epochs": 50, "batch_size": 8, "model": "mlp",
		  "data": {"transforms": [{"name": "ToTensor", "args": []}], "dataset_path": {"train": "` + data + `"}}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	done := regexp.MustCompile(`"unix_ms":(\d+)[^\n]*first step of the new generation done`)
	// outage runs one event per run and returns the time from it to the
	// last of `want` members' first step in the next generation.
	outage := func(what string, want int, event func(run int, cfg string, local *started) time.Time) {
		var times []time.Duration
		for run := range 5 {
			cfg := eventJob(fmt.Sprintf("bench-elastic-%s-%d", what, run))
			local := startRingtrain(t, "local", "-n", "4", "--config", cfg)
			local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 8 })
			at := event(run, cfg, local)
			local.until(t, "the first step after "+what, func(out string) bool { return len(done.FindAllString(out, -1)) == want })
			var last int64
			for _, m := range done.FindAllStringSubmatch(string(local.buf), -1) {
				ms, _ := strconv.ParseInt(m[1], 10, 64)
				last = max(last, ms)
			}
			times = append(times, time.UnixMilli(last).Sub(at))
			local.interrupt()
		}
		sorted := slices.Clone(times)
		slices.Sort(sorted)
		fmt.Printf("bench-elastic: %s → first step of the next generation, 4 peers, %s, median of 5: %v (runs %v)\n",
			what, data, sorted[2].Round(time.Millisecond), times)
	}
	outage("SIGKILL", 3, func(_ int, _ string, local *started) time.Time {
		pid := pidOf(string(local.buf), 3)
		at := time.Now()
		syscall.Kill(pid, syscall.SIGKILL)
		return at
	})
	outage("Ctrl-C leave", 3, func(_ int, _ string, local *started) time.Time {
		pid := pidOf(string(local.buf), 3)
		at := time.Now()
		syscall.Kill(pid, syscall.SIGINT)
		return at
	})
	outage("newcomer started", 4, func(run int, cfg string, local *started) time.Time {
		a := regexp.MustCompile(`\[(?:peer|rank) 0\] listening on (/ip4/127\.0\.0\.1/\S+)`).FindStringSubmatch(string(local.buf))
		if a == nil {
			t.Fatalf("no address of peer 0:\n%s", tails(local.buf))
		}
		at := time.Now()
		newcomer := startRingtrain(t, "join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0", "--bootstrap", a[1], "--log-format", "json")
		t.Cleanup(func() { newcomer.interrupt() })
		return at
	})

	const fashion = "/usr/share/datasets/fashion-mnist"
	if _, err := os.Stat(fashion + "/train-images-idx3-ubyte.gz"); err != nil {
		fmt.Println("bench-elastic: Fashion-MNIST is not installed (make fashion-mnist); accuracy figure skipped")
		return
	}
	job := func(name string) string {
		p := dir + "/" + name + ".json"
		body := `{"name": "` + name + `", "world_size": 4, "min_world_size": 3, "epochs": 3, "batch_size": 16, "seed": 1, "model": "mlp",
		  "optimizer": {"name": "adam", "lr": 0.001, "schedule": "cosine"},
		  "data": {"transforms": [{"name": "ToTensor", "args": []}, {"name": "Normalize", "args": [[0.5], [0.5]]}],
		           "dataset_path": {"train": "` + fashion + `", "test": "` + fashion + `"}}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	accuracy := regexp.MustCompile(`"world_size":(\d),"epochs":3,"test_accuracy":([0-9.]+)`)
	out, err := ringtrain(t, 20*time.Minute, "local", "-n", "4", "--config", job("bench-elastic-whole"))
	if err != nil {
		t.Fatalf("uninterrupted run: %v\n%s", err, tails(out))
	}
	whole := accuracy.FindStringSubmatch(out)
	local := startRingtrain(t, "local", "-n", "4", "--config", job("bench-elastic-lossy"))
	local.until(t, "epoch 2", func(out string) bool { return strings.Contains(out, `"epoch":2,"step":400,`) })
	syscall.Kill(pidOf(string(local.buf), 3), syscall.SIGKILL)
	rest, _ := io.ReadAll(local.out) // the survivors run to the end
	out = string(append(local.buf, rest...))
	local.cmd.Wait()
	lossy := accuracy.FindStringSubmatch(out)
	if whole == nil || lossy == nil {
		t.Fatalf("no summaries: whole %v, lossy %v\n%s", whole, lossy, tails(out))
	}
	a, _ := strconv.ParseFloat(whole[2], 64)
	b, _ := strconv.ParseFloat(lossy[2], 64)
	fmt.Printf("bench-elastic: mlp, 3 epochs, full Fashion-MNIST: 4 peers throughout %.4f; one of 4 lost at epoch 2 step 400 (then %s peers) %.4f; difference %.2f points\n",
		a, lossy[1], b, 100*(a-b))
}
