package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// pipelineJob writes testdata/pipeline-job.json with its data config's
// path made absolute, checkpoints in dir and the fields in extra.
func pipelineJob(t *testing.T, dir, extra string) string {
	t.Helper()
	job, err := os.ReadFile("../../testdata/pipeline-job.json")
	if err != nil {
		t.Fatal(err)
	}
	job = bytes.Replace(job, []byte(`"data": "data-config.json"`),
		[]byte(`"data": "`+mustAbs(t, "../../testdata/data-config.json")+`", "checkpoint_dir": "`+dir+`"`+extra), 1)
	cfg := filepath.Join(dir, "job.json")
	if err := os.WriteFile(cfg, job, 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestPipelineLocal: testdata's pipeline job — a residual MLP whose
// residual crosses the boundary — trains as 2 stages × 2 replicas in four
// processes; every peer reports the same accuracy, the replicas of a stage
// the same parameters, and the model gathered from the stages predicts.
func TestPipelineLocal(t *testing.T) {
	dir := t.TempDir()
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "4", "--config", pipelineJob(t, dir, ""))
	if err != nil {
		t.Fatalf("local: %v\n%s", err, tails(out))
	}
	lines := regexp.MustCompile(`stage (\d) of 2, replica (\d) of 2: test accuracy ([0-9.]+), stage param hash ([0-9a-f]+)`).FindAllStringSubmatch(out, -1)
	if len(lines) != 4 {
		t.Fatalf("%d peers reported; want 4\n%s", len(lines), tails(out))
	}
	hash := map[string]string{}
	for _, l := range lines {
		if l[3] != lines[0][3] {
			t.Errorf("accuracies %s and %s differ", l[3], lines[0][3])
		}
		if h, ok := hash[l[1]]; ok && h != l[4] {
			t.Errorf("stage %s's replicas differ: %s and %s", l[1], h, l[4])
		}
		hash[l[1]] = l[4]
	}
	if acc, _ := strconv.ParseFloat(lines[0][3], 64); acc < 0.6 {
		t.Errorf("test accuracy %v; want well above chance\n%s", acc, tails(out))
	}
	model := filepath.Join(dir, "pipeline-demo.ckpt")
	img := firstImage(t)
	pred, err := ringtrain(t, time.Minute, "predict", "--checkpoint", model, "--image", img)
	if err != nil || !strings.Contains(pred, img+": ") {
		t.Errorf("predict on the gathered model: %v\n%s", err, tails(pred))
	}
	// A stage's own checkpoint is refused by predict, saying what to use.
	pred, err = ringtrain(t, time.Minute, "predict", "--checkpoint", filepath.Join(dir, "pipeline-demo.stage1.ckpt"), "--image", img)
	if err == nil || !strings.Contains(pred, "pipeline stage's checkpoint") {
		t.Errorf("predict on a stage checkpoint: %v\n%s", err, tails(pred))
	}
}

func firstImage(t *testing.T) string {
	t.Helper()
	imgs, _ := filepath.Glob(mustAbs(t, "../../testdata/fashion-folder/test/*/*"))
	if len(imgs) == 0 {
		t.Fatal("no test images")
	}
	return imgs[0]
}

// TestPipelineCtrlC: Ctrl-C on one peer of a pipeline job whose stage has
// another peer makes it leave while the others go on; Ctrl-C on all stops
// every stage after the same step, the gathered model is written, and the
// job started again resumes every stage from its checkpoint and finishes.
// Pipeline peers serve --metrics as any peer does.
func TestPipelineCtrlC(t *testing.T) {
	dir := t.TempDir()
	cfg := pipelineJob(t, dir, `, "epochs": 60`)
	local := startRingtrain(t, "local", "-n", "4", "--config", cfg, "--metrics", "127.0.0.1:0")
	local.until(t, "training", func(out string) bool { return strings.Count(out, `"steps":`) >= 2 })
	if n := strings.Count(string(local.buf), "metrics on http://127.0.0.1:"); n != 4 {
		t.Errorf("%d pipeline peers serve metrics; want 4", n)
	}
	m := regexp.MustCompile(`\[peer 2\] started, pid (\d+)`).FindStringSubmatch(string(local.buf))
	if m == nil {
		t.Fatalf("no pid for peer 2:\n%s", tails(local.buf))
	}
	pid, _ := strconv.Atoi(m[1])
	// Its stage has another peer: it leaves, and the others go on.
	syscall.Kill(pid, syscall.SIGINT)
	local.until(t, "the others to go on without peer 2", func(out string) bool {
		at := strings.Index(out, "] left the job (stage")
		return at >= 0 && strings.Count(out[at:], `"steps":`) >= 3
	})
	// Ctrl-C on all: every stage stops after the same step.
	out, _ := local.interrupt()
	steps := regexp.MustCompile(`"steps_done":(\d+),[^\n]*interrupted: every stage stopped after the same step`).FindAllStringSubmatch(out, -1)
	if len(steps) < 2 {
		t.Fatalf("%d peers stopped together; want every stage's\n%s", len(steps), tails(out))
	}
	for _, s := range steps {
		if s[1] != steps[0][1] {
			t.Errorf("peers stopped after %s and %s steps", s[1], steps[0][1])
		}
	}
	if !strings.Contains(out, "the stages' parameters gathered into one model file") {
		t.Errorf("no model gathered:\n%s", tails(out))
	}
	// Started again, every stage resumes from its checkpoint.
	out, err := ringtrain(t, 3*time.Minute, "local", "-n", "4", "--config", cfg)
	if err != nil {
		t.Fatalf("started again: %v\n%s", err, tails(out))
	}
	if n := strings.Count(out, "resuming the stage from its checkpoint"); n != 4 {
		t.Errorf("%d peers resumed; want 4\n%s", n, tails(out))
	}
	if n := strings.Count(out, `"epochs":60,"test_accuracy"`); n != 4 {
		t.Errorf("%d peers finished 60 epochs; want 4\n%s", n, tails(out))
	}
}

// TestPipelineConfigRefused: a pipeline section that cannot be run is
// refused when the job file is read, saying why.
func TestPipelineConfigRefused(t *testing.T) {
	dataCfg := mustAbs(t, "../../testdata/data-config.json")
	residual := `{"layers": [{"type": "linear", "out": 16}, {"type": "relu", "save": "a"}, {"type": "linear", "out": 16}, {"type": "add", "from": "a"}, {"type": "linear", "out": 10}]}`
	forward := `{"layers": [{"type": "linear", "out": 16}, {"type": "add", "from": "b"}, {"type": "relu", "save": "b"}, {"type": "linear", "out": 10}]}`
	for _, tc := range []struct {
		name, model, pipeline, extra, want string
	}{
		{"more stages than layers", residual, `{"stages": 6, "micro_batches": 2}`, `"world_size": 6`, "stages 6 for a model of 5 layers"},
		{"world not a multiple", residual, `{"stages": 3, "micro_batches": 2}`, `"world_size": 4`, "world_size 4 is not a multiple of stages 3"},
		{"micro-batches past the batch", residual, `{"stages": 2, "micro_batches": 9}`, `"world_size": 4`, "micro_batches 9 for batches of 8"},
		{"unknown schedule", residual, `{"stages": 2, "micro_batches": 2, "schedule": "zb"}`, `"world_size": 4`, `schedule "zb"`},
		{"split of the wrong length", residual, `{"stages": 2, "micro_batches": 2, "split": [1, 3]}`, `"world_size": 4`, "2 stages need 1"},
		{"split past the layers", residual, `{"stages": 2, "micro_batches": 2, "split": [5]}`, `"world_size": 4`, "cut 5 leaves a stage without layers"},
		{"elastic sizes", residual, `{"stages": 2, "micro_batches": 2}`, `"world_size": 4, "min_world_size": 2`, "a pipeline job carries on while every stage has a peer"},
		{"with DiLoCo", residual, `{"stages": 2, "micro_batches": 2}`, `"world_size": 4, "sync": {"every": 5, "outer": {"lr": 0.7}}`, "sync (DiLoCo) and pipeline"},
		{"unknown field", residual, `{"stages": 2, "micro_batches": 2, "replicas": 2}`, `"world_size": 4`, `unknown field "replicas"`},
		{"dependency pointing forward", forward, `{"stages": 2, "micro_batches": 2}`, `"world_size": 4`, `from "b": no earlier layer saved that name`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "job.json")
			body := `{"name": "p", ` + tc.extra + `, "epochs": 1, "batch_size": 8, "model": ` + tc.model + `, "pipeline": ` + tc.pipeline + `, "data": "` + dataCfg + `"}`
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
			c, err := loadJobConfig(p)
			if err == nil && tc.name == "dependency pointing forward" {
				// The spec is checked against the data's shape.
				_, err = c.modelSpec(1, 28, 28, 10)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v; want an error saying %q", err, tc.want)
			}
		})
	}
}

// TestPipelineInTheHash: the pipeline section is part of the job (its
// defaults written out), and a peer joining with --job gets it.
func TestPipelineInTheHash(t *testing.T) {
	dataCfg := mustAbs(t, "../../testdata/data-config.json")
	load := func(pipeline string) *jobConfig {
		t.Helper()
		p := filepath.Join(t.TempDir(), "job.json")
		body := `{"name": "p", "world_size": 4, "epochs": 1, "batch_size": 8, "model": "mlp", "data": "` + dataCfg + `"` + pipeline + `}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := loadJobConfig(p)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	plain := load("")
	short := load(`, "pipeline": {"stages": 2, "micro_batches": 2}`)
	long := load(`, "pipeline": {"stages": 2, "micro_batches": 2, "schedule": "1f1b", "boundary": "f32"}`)
	other := load(`, "pipeline": {"stages": 2, "micro_batches": 2, "split": [3]}`)
	if short.hash == plain.hash || short.hash != long.hash || other.hash == short.hash {
		t.Errorf("hashes: plain %.8s, pipeline %.8s, with its defaults %.8s, with a split %.8s", plain.hash, short.hash, long.hash, other.hash)
	}
	b, err := other.handedOut()
	if err != nil {
		t.Fatal(err)
	}
	got, err := parseHandedOut(b, "p", other.hash, localSettings{}, dataCfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.Pipeline == nil || got.Pipeline.Stages != 2 || len(got.Pipeline.Split) != 1 || got.Pipeline.Split[0] != 3 {
		t.Errorf("handed out: %+v", got.Pipeline)
	}
}

// TestPipelineProcessesTrainAsWhole: the pipeline job in processes — 2
// and 3 stages, with 1 and 2 replicas each — ends with the very
// parameters (the gathered model files) that the same job as one stage
// reaches with the same replicas and micro-batches.
func TestPipelineProcessesTrainAsWhole(t *testing.T) {
	run := func(t *testing.T, stages, replicas int, split string) []float32 {
		t.Helper()
		dir := t.TempDir()
		world := strconv.Itoa(stages * replicas)
		cfg := pipelineJob(t, dir, "")
		b, _ := os.ReadFile(cfg)
		b = bytes.Replace(b, []byte(`"world_size": 4`), []byte(`"world_size": `+world), 1)
		b = bytes.Replace(b, []byte(`"stages": 2, "micro_batches": 4, "schedule": "1f1b", "split": [4]`),
			[]byte(`"stages": `+strconv.Itoa(stages)+`, "micro_batches": 4, "schedule": "1f1b"`+split), 1)
		os.WriteFile(cfg, b, 0o644)
		out, err := ringtrain(t, 3*time.Minute, "local", "-n", world, "--config", cfg)
		if err != nil {
			t.Fatalf("local -n %s: %v\n%s", world, err, tails(out))
		}
		if want := "stage 0 of " + strconv.Itoa(stages) + ", replica 0 of " + strconv.Itoa(replicas); !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, tails(out))
		}
		return checkpointParams(t, filepath.Join(dir, "pipeline-demo.ckpt"))
	}
	for _, replicas := range []int{1, 2} {
		whole := run(t, 1, replicas, "")
		for _, tc := range []struct {
			stages int
			split  string
		}{{2, `, "split": [4]`}, {3, `, "split": [2, 5]`}} {
			t.Run(fmt.Sprintf("%d×%d", tc.stages, replicas), func(t *testing.T) {
				got := run(t, tc.stages, replicas, tc.split)
				if len(whole) != len(got) {
					t.Fatalf("%d parameters split, %d whole", len(got), len(whole))
				}
				for i := range whole {
					if math.Float32bits(whole[i]) != math.Float32bits(got[i]) {
						t.Fatalf("parameter %d: %v split in %d stages, %v as one", i, got[i], tc.stages, whole[i])
					}
				}
			})
		}
	}
}
