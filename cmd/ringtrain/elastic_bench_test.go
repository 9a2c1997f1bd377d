//go:build bench

package main

import (
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBenchElastic is issue 6's benchmark, not a test: it asserts nothing,
// so it is built only with -tags bench (make bench-elastic) and prints its
// figures.
//
//  1. The time from SIGKILLing one of 4 peers to the survivors' first
//     completed step in the new generation (the slowest survivor's), with
//     default settings but min_world_size 3, 5 runs and their median.
//  2. With the full Fashion-MNIST: test accuracy of a 3-epoch mlp run of 4
//     peers that loses one in epoch 2, against the same run uninterrupted.
func TestBenchElastic(t *testing.T) {
	dir := t.TempDir()
	pidOf := func(out string, peer int) int {
		m := regexp.MustCompile(fmt.Sprintf(`\[peer %d\] started, pid (\d+)`, peer)).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no pid for peer %d:\n%s", peer, out)
		}
		p, _ := strconv.Atoi(m[1])
		return p
	}
	var outages []time.Duration
	for run := range 5 {
		cfg := writeJobFile(t, dir, fmt.Sprintf(`"name": "bench-elastic-%d", "world_size": 4, "min_world_size": 3, "epochs": 50`, run))
		local := startRingtrain(t, "local", "-n", "4", "--config", cfg)
		local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 8 })
		pid := pidOf(string(local.buf), 3)
		killed := time.Now()
		syscall.Kill(pid, syscall.SIGKILL)
		done := regexp.MustCompile(`"unix_ms":(\d+)[^\n]*first step of the new generation done`)
		local.until(t, "the survivors' first step", func(out string) bool { return len(done.FindAllString(out, -1)) == 3 })
		var last int64
		for _, m := range done.FindAllStringSubmatch(string(local.buf), -1) {
			ms, _ := strconv.ParseInt(m[1], 10, 64)
			last = max(last, ms)
		}
		d := time.UnixMilli(last).Sub(killed)
		outages = append(outages, d)
		fmt.Printf("bench-elastic: run %d: SIGKILL to the survivors' first step in generation 2: %v\n", run+1, d.Round(time.Millisecond))
		local.interrupt()
	}
	slices.Sort(outages)
	fmt.Printf("bench-elastic: SIGKILL → first step of the new generation, 4 peers → 3, median of 5: %v (runs %v)\n",
		outages[2].Round(time.Millisecond), outages)

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
		t.Fatalf("uninterrupted run: %v\n%s", err, out)
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
		t.Fatalf("no summaries: whole %v, lossy %v\n%s", whole, lossy, out)
	}
	a, _ := strconv.ParseFloat(whole[2], 64)
	b, _ := strconv.ParseFloat(lossy[2], 64)
	fmt.Printf("bench-elastic: mlp, 3 epochs, full Fashion-MNIST: 4 peers throughout %.4f; one of 4 lost at epoch 2 step 400 (then %s peers) %.4f; difference %.2f points\n",
		a, lossy[1], b, 100*(a-b))
}
