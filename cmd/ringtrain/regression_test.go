package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/train"
)

// regressionJob writes testdata's regression job (or its pipeline
// variant) into dir with its data paths made absolute, a checkpoint
// folder, and the replacements given (old, new, old, new, …).
func regressionJob(t *testing.T, dir, file string, replace ...string) string {
	t.Helper()
	job, err := os.ReadFile(filepath.Join("../../testdata", file))
	if err != nil {
		t.Fatal(err)
	}
	abs := mustAbs(t, "../../testdata/regression")
	job = bytes.ReplaceAll(job, []byte(`"regression/`), []byte(`"`+abs+`/`))
	job = bytes.Replace(job, []byte(`"seed": 1,`), []byte(`"seed": 1, "checkpoint_dir": "`+dir+`",`), 1)
	for i := 0; i+1 < len(replace); i += 2 {
		if !bytes.Contains(job, []byte(replace[i])) {
			t.Fatalf("%s has no %q", file, replace[i])
		}
		job = bytes.Replace(job, []byte(replace[i]), []byte(replace[i+1]), 1)
	}
	cfg := filepath.Join(dir, "job.json")
	if err := os.WriteFile(cfg, job, 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// checkpointParams is a checkpoint's parameters, joined.
func checkpointParams(t *testing.T, path string) []float32 {
	t.Helper()
	c, err := train.LoadCheckpoint(path)
	if err != nil {
		t.Fatal(err)
	}
	var all []float32
	for _, p := range c.Params {
		all = append(all, p...)
	}
	return all
}

// TestRegressionTrainsAsWritten: the layer-list regression — one
// feature, 512-wide linear layers with a residual, a sigmoid output, MSE
// against a CSV's float column, Adam 3e-3, batch 32 — learns its curve on
// one peer, and, cut into 3 pipeline stages of 3 processes, ends with the
// very parameters: the one peer's with whole batches, and one stage's
// with the same micro-batches.
func TestRegressionTrainsAsWritten(t *testing.T) {
	var ckptPath string // the last run's
	run := func(t *testing.T, n int, file, ckpt string, replace ...string) ([]float32, float64) {
		t.Helper()
		dir := t.TempDir()
		out, err := ringtrain(t, 3*time.Minute, "local", "-n", strconv.Itoa(n), "--config", regressionJob(t, dir, file, replace...))
		if err != nil {
			t.Fatalf("local -n %d %s: %v\n%s", n, file, err, tails(out))
		}
		m := regexp.MustCompile(`test loss \(mse\) ([0-9.e-]+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no test loss in:\n%s", tails(out))
		}
		loss, _ := strconv.ParseFloat(m[1], 64)
		ckptPath = filepath.Join(dir, ckpt)
		return checkpointParams(t, ckptPath), loss
	}
	sameParams := func(t *testing.T, what string, got, want []float32) {
		t.Helper()
		if len(got) != len(want) {
			t.Fatalf("%s: %d parameters; want %d", what, len(got), len(want))
		}
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("%s: parameter %d is %v; want %v", what, i, got[i], want[i])
			}
		}
	}
	one, loss := run(t, 1, "regression-job.json", "regression.ckpt")
	// The targets vary by 0.06 (a sine of amplitude 0.35) and carry
	// noise of 0.0004: a model that learned nothing scores the former.
	if !(loss < 0.01) {
		t.Errorf("test mse %v after 10 epochs; want below 0.01", loss)
	}
	// Its checkpoint exports as a model of features, and predict, which
	// reads images, refuses it by name.
	out, err := ringtrain(t, time.Minute, "export", "--checkpoint", ckptPath, "--onnx", filepath.Join(t.TempDir(), "r.onnx"))
	if err != nil || !strings.Contains(out, "input [1] features per sample, 1 outputs (loss mse)") {
		t.Errorf("export: %v\n%s", err, out)
	}
	out, err = ringtrain(t, time.Minute, "predict", "--checkpoint", ckptPath, "--image", "../../testdata/fashion-folder/test/Bag/9969.jpg")
	if err == nil || !strings.Contains(out, "a model of float targets (loss mse)") {
		t.Errorf("predict of a regression: %v\n%s", err, out)
	}
	split, _ := run(t, 3, "regression-pipeline-job.json", "regression-pipeline.ckpt", `"micro_batches": 4`, `"micro_batches": 1`)
	sameParams(t, "3 stages against one peer", split, one)
	// Every step sums its micro-batches in the same order, so 3 epochs
	// (192 steps) check that order as well as 10; the 10-epoch equality
	// is the 3 stages against one peer above.
	micro, _ := run(t, 3, "regression-pipeline-job.json", "regression-pipeline.ckpt", `"epochs": 10`, `"epochs": 3`)
	whole, _ := run(t, 1, "regression-pipeline-job.json", "regression-pipeline.ckpt", `"epochs": 10`, `"epochs": 3`,
		`"world_size": 3`, `"world_size": 1`, `"stages": 3, "micro_batches": 4, "split": [3, 7]`, `"stages": 1, "micro_batches": 4`)
	sameParams(t, "3 stages of 4 micro-batches against one", micro, whole)
}
