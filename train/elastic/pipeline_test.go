package elastic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/pipeline"
)

// pipelineRun runs a pipeline job of n peers on the test subset; stopAt,
// if not negative, cancels peer stopPeer's context once it has done that
// many steps.
func pipelineRun(t *testing.T, n int, cfg pipeline.Config, stopPeer, stopAt int) ([]PipelineSummary, []error, string, string) {
	t.Helper()
	sums, errs, log, ckpt, _ := pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), n, cfg, events{stopPeer: stopPeer, stopAt: stopAt, killPeer: -1})
	return sums, errs, log, ckpt
}

// events are what happens to a pipeline run's peers: peer stopPeer is
// stopped (Ctrl-C) once it has done stopAt steps, and peer killPeer
// killed once it has done killAt (−1: none).
type events struct {
	stopPeer, stopAt, killPeer, killAt int
	stopAll                            bool // every peer is stopped at stopAt
	newcomer                           bool // one more peer starts once the killed one is gone
	newcomerAt                         int  // and, if set, once peer 0 has done this many steps
	pause                              time.Duration
	// spareLeaves is a peer stopped (Ctrl-C) once it waits as a spare;
	// spareStalls one stalled then (SIGSTOP), until the others are done.
	spareLeaves, spareStalls int
	// stepTimeout, if set, is every peer's StepTimeout (else 20 s).
	stepTimeout time.Duration
	// liar is a peer whose parameters drift from its stage's after
	// driftAt forward passes (0: none).
	liar, driftAt int
}

// pipelineRunIn is pipelineRun with the checkpoints at ckpt.
func pipelineRunIn(t *testing.T, ckpt string, n int, cfg pipeline.Config, ev events) ([]PipelineSummary, []error, string, string, *world) {
	t.Helper()
	dcfg, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	split, err := dcfg.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	test, err := dcfg.Load("test")
	if err != nil {
		t.Fatal(err)
	}
	spec := train.Spec{Input: []int{784}, Layers: []train.Layer{
		{Type: "linear", Out: 32}, {Type: "relu", Save: "a"}, {Type: "linear", Out: 32}, {Type: "relu"},
		{Type: "add", From: "a"}, {Type: "linear", Out: 10}}}
	model := train.ModelConfig{Spec: spec, Batch: 16, Seed: 3}
	w := newWorld(t, peers(n))
	var log lockedBuffer
	total := n
	if ev.newcomer {
		total++
	}
	sums := make([]PipelineSummary, total)
	errs := make([]error, total)
	ended := make([]chan struct{}, total)
	killed, later := make(chan struct{}), make(chan struct{})
	var once, onceLater sync.Once
	if ev.newcomerAt == 0 {
		close(later)
	}
	var wg sync.WaitGroup
	cancels := make([]context.CancelFunc, total)
	for i := range total {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cancels[i] = cancel
		job := &PipelineJob{Members: w.member(fmt.Sprintf("peer-%d", i)), Pipeline: cfg, Model: model, StepTimeout: cmp.Or(ev.stepTimeout, 20*time.Second), PauseTimeout: ev.pause,
			Checkpoint: ckpt, CheckpointBase: train.Checkpoint{Seed: 3, Classes: split.Classes},
			Logger: zerolog.New(&log).With().Int("peer", i).Logger(), Out: &log,
			NewReplica: func(m train.Model) (*train.Replica, error) {
				if ev.driftAt > 0 && i == ev.liar {
					m = &drifter{Model: m, n: ev.driftAt}
				}
				// At LR 0.05 this small job's second epoch swung between
				// 0.14 and 0.36 accuracy with a change in the last bits
				// of the loss; at 0.02 it learns steadily.
				return train.NewReplica(m, &train.SGD{LR: 0.02, Momentum: 0.9}, nil), nil
			},
			Dropped: func(peers []string, _ string) { w.drop(peers) }}
		job.Training = train.RunConfig{Epochs: 2, Classes: 10, ProgressEvery: 1,
			Train: &data.Loader{Split: split, BatchSize: 16, Seed: 1, Sampler: data.Sampler{N: split.Len(), World: 1, Seed: 1, Shuffle: true}},
			Test:  &data.Loader{Split: test, BatchSize: 16, Seed: 1, Sampler: data.Sampler{N: test.Len(), World: 1, Seed: 1, Exact: true}}}
		job.Training.Progress = func(p train.Progress) {
			if i == 0 && ev.newcomerAt > 0 && p.Stats.Steps >= ev.newcomerAt {
				onceLater.Do(func() { close(later) })
			}
			switch {
			case p.EpochDone:
			case (i == ev.stopPeer || ev.stopAll) && p.Stats.Steps >= ev.stopAt:
				cancel()
			case i == ev.killPeer && p.Stats.Steps >= ev.killAt:
				w.kill(fmt.Sprintf("peer-%d", i))
				once.Do(func() { close(killed) })
			}
		}
		ended[i] = make(chan struct{})
		wg.Go(func() {
			defer close(ended[i])
			if i == n {
				<-killed
				<-later
			}
			if sums[i], errs[i] = job.Run(ctx); errs[i] != nil {
				w.kill(fmt.Sprintf("peer-%d", i)) // its process exits
			}
		})
	}
	if spare := max(ev.spareLeaves, ev.spareStalls); spare > 0 {
		wg.Go(func() {
			want := fmt.Sprintf(`"peer":%d,`, spare)
			for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				for _, l := range strings.Split(log.String(), "\n") {
					if strings.Contains(l, want) && strings.Contains(l, "a spare of its stage") {
						if ev.spareStalls > 0 {
							w.stall(fmt.Sprintf("peer-%d", spare))
						} else {
							cancels[spare]()
						}
						return
					}
				}
			}
		})
	}
	if ev.spareStalls > 0 {
		// The stalled spare is killed once the others are done, or after
		// two minutes (then they waited for it): its streams fail, and
		// its process ends rather than waiting to re-form with no one.
		wg.Go(func() {
			timeout := time.After(2 * time.Minute)
			for i, e := range ended {
				if i == ev.spareStalls {
					continue
				}
				select {
				case <-e:
				case <-timeout:
				}
			}
			close(w.done)
			cancels[ev.spareStalls]()
		})
	}
	wg.Wait()
	return sums, errs, log.String(), ckpt, w
}

func TestPipelineJobTrainsAndGathers(t *testing.T) {
	for _, cfg := range []pipeline.Config{
		{Stages: 2, MicroBatches: 4, Split: []int{3}},
		{Stages: 2, MicroBatches: 2, Schedule: pipeline.GPipe}, // split measured by rank 0
	} {
		t.Run(fmt.Sprint(cfg.Split, cfg.Schedule), func(t *testing.T) {
			sums, errs, log, ckpt := pipelineRun(t, 4, cfg, -1, 0)
			t.Logf("test accuracy %v, split %v", sums[0].TestAccuracy, sums[0].Split)
			for i, err := range errs {
				if err != nil {
					t.Fatalf("peer %d: %v\n%s", i, err, log)
				}
			}
			for i, s := range sums {
				if s.Epochs != 2 || s.Stage != i/2 || s.Replica != i%2 || s.Stages != 2 || len(s.Split) != 1 {
					t.Errorf("peer %d: %+v", i, s)
				}
				if s.Split[0] != sums[0].Split[0] {
					t.Errorf("peer %d split %v, peer 0 %v", i, s.Split, sums[0].Split)
				}
				if s.TestAccuracy != sums[0].TestAccuracy || s.TestAccuracy < 0.3 {
					t.Errorf("peer %d reports %v, peer 0 %v", i, s.TestAccuracy, sums[0].TestAccuracy)
				}
			}
			// The stage's replicas agree, and the stages differ.
			if sums[0].ParamHash != sums[1].ParamHash || sums[2].ParamHash != sums[3].ParamHash || sums[0].ParamHash == sums[2].ParamHash {
				t.Errorf("hashes %s %s %s %s", sums[0].ParamHash[:8], sums[1].ParamHash[:8], sums[2].ParamHash[:8], sums[3].ParamHash[:8])
			}
			c, err := train.LoadCheckpoint(ckpt)
			if err != nil {
				t.Fatal(err)
			}
			m, err := train.NewModel(c.Model)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if err := c.LoadInto(m); err != nil {
				t.Fatal(err)
			}
			if c.Epoch != 2 {
				t.Errorf("gathered model of %d epochs; want 2", c.Epoch)
			}
			if !strings.Contains(log, "pipeline formed: rank 3 of 4, stage 1 of 2, replica 1 of 2") {
				t.Errorf("log:\n%s", log)
			}
		})
	}
}

// Ctrl-C on any one peer stops every peer after the same step, and the
// gathered model is written all the same.
// A peer asked to stop that holds its stage alone stops every stage after
// the same step, and the model is gathered there.
func TestPipelineJobStopsTogether(t *testing.T) {
	for _, asker := range []int{0, 1} {
		t.Run(fmt.Sprint(asker), func(t *testing.T) {
			sums, errs, log, ckpt := pipelineRun(t, 2, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}}, asker, 5)
			for i, err := range errs {
				want := train.ErrStopped
				if i == asker {
					want = context.Canceled
				}
				if !errors.Is(err, want) {
					t.Errorf("peer %d: %v; want %v\n%s", i, err, want, log)
				}
				if sums[i].Steps != sums[0].Steps || sums[i].Steps < 5 {
					t.Errorf("peer %d stopped after %d steps, peer 0 after %d", i, sums[i].Steps, sums[0].Steps)
				}
			}
			c, err := train.LoadCheckpoint(ckpt)
			if err != nil {
				t.Fatal(err)
			}
			if c.Step != sums[0].Steps {
				t.Errorf("gathered model at step %d; the peers stopped after %d", c.Step, sums[0].Steps)
			}
		})
	}
}

// A job stopped and started again resumes every stage from its checkpoint
// and ends where it would have without the stop, bit for bit.
func TestPipelineJobResumes(t *testing.T) {
	cfg := pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}}
	whole, errs, log, _ := pipelineRun(t, 4, cfg, -1, 0)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	ckpt := filepath.Join(t.TempDir(), "model.ckpt")
	stopped, _, log, _, _ := pipelineRunIn(t, ckpt, 4, cfg, events{stopPeer: -1, stopAll: true, stopAt: 7, killPeer: -1})
	if stopped[0].Steps < 7 || stopped[0].Steps >= whole[0].Steps {
		t.Fatalf("stopped after %d steps of %d\n%s", stopped[0].Steps, whole[0].Steps, log)
	}
	again, errs, log, _, _ := pipelineRunIn(t, ckpt, 4, cfg, events{stopPeer: -1, killPeer: -1})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if !strings.Contains(log, "resuming the stage from its checkpoint") {
		t.Errorf("no resume:\n%s", log)
	}
	for i := range again {
		if again[i].ParamHash != whole[i].ParamHash {
			t.Errorf("peer %d: resumed run ends at %.12s; the run without a stop at %.12s", i, again[i].ParamHash, whole[i].ParamHash)
		}
	}
	// Stage checkpoints of different steps are refused.
	for stage, step := range []int{20, 3} {
		path := fmt.Sprintf("%s.stage%d.ckpt", strings.TrimSuffix(ckpt, ".ckpt"), stage)
		c, err := train.LoadCheckpoint(path)
		if err != nil {
			t.Fatal(err)
		}
		c.Epoch, c.Step, c.Skip = 1, step, 0
		if err := c.Save(path); err != nil {
			t.Fatal(err)
		}
	}
	_, errs, _, _, _ = pipelineRunIn(t, ckpt, 4, cfg, events{stopPeer: -1, killPeer: -1})
	for i, err := range errs {
		if !errors.Is(err, train.ErrCheckpoint) {
			t.Errorf("peer %d: %v; want stages at different steps refused", i, err)
		}
	}
}

// A peer asked to stop whose stage has other peers leaves after the step
// every peer stops after; the others go on from that step without it
// (nothing done twice), its stage with one replica fewer, and end whole.
func TestPipelineReplicaLeaves(t *testing.T) {
	for _, leaver := range []int{0, 5} {
		t.Run(fmt.Sprint(leaver), func(t *testing.T) {
			ckpt := filepath.Join(t.TempDir(), "model.ckpt")
			sums, errs, log, _, _ := pipelineRunIn(t, ckpt, 6, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
				events{stopPeer: leaver, stopAt: 5, killPeer: -1})
			if !errors.Is(errs[leaver], ErrLeft) {
				t.Fatalf("the peer asked to stop: %v; want ErrLeft\n%s", errs[leaver], log)
			}
			left := sums[leaver].Steps
			back := fmt.Sprintf(`"steps_done":%d,"message":"back to the latest snapshot every peer holds"`, left)
			if left < 5 || !strings.Contains(log, back) {
				t.Errorf("left after %d steps; the others did not go on from there\n%s", left, log)
			}
			hashes := map[int]string{}
			for i, err := range errs {
				if i == leaver {
					continue
				}
				if err != nil {
					t.Fatalf("peer %d: %v\n%s", i, err, log)
				}
				if s := sums[i]; s.Replica >= 0 {
					if s.Epochs != 2 || s.Replicas != 2 {
						t.Errorf("peer %d: %d epochs, %d replicas; want 2 and 2", i, s.Epochs, s.Replicas)
					}
					if h, ok := hashes[s.Stage]; ok && h != s.ParamHash {
						t.Errorf("stage %d's replicas end apart: %.12s and %.12s", s.Stage, h, s.ParamHash)
					}
					hashes[s.Stage] = s.ParamHash
				}
			}
			if c, err := train.LoadCheckpoint(ckpt); err != nil || c.Epoch != 2 {
				t.Errorf("gathered model: %v, %+v", err, c)
			}
		})
	}
}

// A standby — a peer started again, or a new one — is admitted into a
// stage that still has peers at a step every peer stops after, takes the
// stage's state from them, and trains to the end; the spare that the loss
// made (peer 1), whose snapshots went stale meanwhile, is active again
// and takes its stage's state from peer 0.
func TestPipelineStandbyIsAdmitted(t *testing.T) {
	sums, errs, log, _, _ := pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), 4, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: 3, killAt: 30, newcomer: true, newcomerAt: 90})
	for _, i := range []int{0, 1, 2, 4} {
		if errs[i] != nil {
			t.Fatalf("peer %d: %v\n%s", i, errs[i], log)
		}
		if s := sums[i]; s.Epochs != 2 || s.Replicas != 2 || s.Replica < 0 {
			t.Errorf("peer %d: %d epochs, replica %d of %d; want 2 epochs, every peer a replica of 2", i, s.Epochs, s.Replica, s.Replicas)
		}
	}
	if !strings.Contains(log, "standbys admitted to the pipeline") {
		t.Errorf("no admission:\n%s", log)
	}
	if sums[4].Stage != 1 || sums[4].ParamHash != sums[2].ParamHash || sums[1].ParamHash != sums[0].ParamHash {
		t.Errorf("stage 1: newcomer %.12s, peer 2 %.12s (newcomer in stage %d); stage 0: peer 0 %.12s, peer 1 %.12s",
			sums[4].ParamHash, sums[2].ParamHash, sums[4].Stage, sums[0].ParamHash, sums[1].ParamHash)
	}
}

// A spare Ctrl-C'd leaves at once, and the others train on to the end.
func TestPipelineSpareLeaves(t *testing.T) {
	_, errs, log, _, _ := pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), 4, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: 3, killAt: 30, spareLeaves: 1})
	if !errors.Is(errs[1], ErrLeft) {
		t.Errorf("the spare: %v; want ErrLeft\n%s", errs[1], log)
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Errorf("peer %d: %v\n%s", i, errs[i], log)
		}
	}
}

// A spare that stops answering (SIGSTOP) is a peer lost once the others
// end their run and every member must learn why it ended: their wait
// for it is bounded by the step timeout, they re-form without it, and
// the job ends with the model gathered.
func TestPipelineStalledSpareIsLost(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "model.ckpt")
	sums, errs, log, _, _ := pipelineRunIn(t, ckpt, 4, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: 3, killAt: 30, spareStalls: 1, stepTimeout: 5 * time.Second})
	if errs[1] == nil {
		t.Errorf("the stalled spare ended well")
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Fatalf("peer %d: %v\n%s", i, errs[i], log)
		}
		if sums[i].Epochs != 2 {
			t.Errorf("peer %d: %d epochs; want 2", i, sums[i].Epochs)
		}
	}
	if !strings.Contains(log, "agreeing why the stages stopped") {
		t.Errorf("the others never gave up on the stalled spare:\n%s", log)
	}
	c, err := train.LoadCheckpoint(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	if c.Epoch != 2 {
		t.Errorf("gathered model of %d epochs; want 2", c.Epoch)
	}
}

// A stage of two replicas that loses one carries on: the survivors
// re-form, every stage trains with one replica (the other stage's second
// peer waits as a spare), all go back to the latest snapshot they hold,
// and the job ends with the whole model gathered.
func TestPipelineJobSurvivesALostReplica(t *testing.T) {
	for _, killed := range []int{3, 0} {
		t.Run(fmt.Sprint(killed), func(t *testing.T) {
			ckpt := filepath.Join(t.TempDir(), "model.ckpt")
			sums, errs, log, _, _ := pipelineRunIn(t, ckpt, 4, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
				events{stopPeer: -1, killPeer: killed, killAt: 30})
			for i, err := range errs {
				if i == killed {
					if err == nil {
						t.Errorf("the killed peer ended well")
					}
					continue
				}
				if err != nil {
					t.Fatalf("peer %d: %v\n%s", i, err, log)
				}
			}
			t.Logf("%d re-formations", sums[(killed+1)%4].Reforms)
			if !strings.Contains(log, "back to the latest snapshot every peer holds") || !strings.Contains(log, "a spare of its stage") {
				t.Errorf("no rollback or no spare:\n%s", log)
			}
			var active int
			for i, s := range sums {
				if i != killed && s.Replica == 0 {
					active++
					if s.Epochs != 2 || s.TestAccuracy < 0.3 || s.Replicas != 1 {
						t.Errorf("peer %d: %+v", i, s)
					}
				}
			}
			if active != 2 {
				t.Errorf("%d active peers at the end; want one per stage", active)
			}
			c, err := train.LoadCheckpoint(ckpt)
			if err != nil {
				t.Fatal(err)
			}
			if c.Epoch != 2 {
				t.Errorf("gathered model of %d epochs; want 2", c.Epoch)
			}
		})
	}
}

// A stage left with no peer pauses the job until a newcomer takes it from
// the stage's checkpoint; then the job trains on and ends whole.
func TestPipelineJobPausesForAnEmptyStage(t *testing.T) {
	ckpt := filepath.Join(t.TempDir(), "model.ckpt")
	sums, errs, log, _, _ := pipelineRunIn(t, ckpt, 2, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: 1, killAt: 30, newcomer: true})
	if errs[1] == nil {
		t.Error("the killed peer ended well")
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil {
			t.Fatalf("peer %d: %v\n%s", i, errs[i], log)
		}
		if sums[i].Epochs != 2 || sums[i].Stage != i/2 || sums[i].TestAccuracy < 0.3 {
			t.Errorf("peer %d: %+v", i, sums[i])
		}
	}
	for _, want := range []string{"the job waits for a peer to take the stage", "a peer came to take the stage", "back to the latest snapshot every peer holds"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q:\n%s", want, log)
		}
	}
	c, err := train.LoadCheckpoint(ckpt)
	if err != nil {
		t.Fatal(err)
	}
	if c.Epoch != 2 {
		t.Errorf("gathered model of %d epochs; want 2", c.Epoch)
	}
}

// With nobody to take an empty stage, the job ends after the pause, saying
// why.
func TestPipelineJobGivesUpOnAnEmptyStage(t *testing.T) {
	_, errs, log, _, _ := pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), 2, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: 1, killAt: 30, pause: time.Second})
	if !errors.Is(errs[0], ErrPipelineChange) || !strings.Contains(errs[0].Error(), "no peer came to take it") {
		t.Errorf("the survivor: %v; want ErrPipelineChange saying no peer came\n%s", errs[0], log)
	}
}

// A peer whose stage catches it lying (its parameters drift from the
// stage's other replicas') is dropped: the others re-form without it —
// the stage beside its own too, which only saw its stage fail — and it is
// in no ring after, nor admitted if it starts again; the job trains on to
// its end.
func TestPipelineLiarIsDropped(t *testing.T) {
	sums, errs, log, _, w := pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), 6, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}},
		events{stopPeer: -1, killPeer: -1, liar: 5, driftAt: 10})
	if !errors.Is(errs[5], train.ErrLiar) {
		t.Errorf("the liar: %v; want ErrLiar\n%s", errs[5], log)
	}
	for i := range 5 {
		if errs[i] != nil {
			t.Fatalf("peer %d: %v\n%s", i, errs[i], log)
		}
		if sums[i].Replica >= 0 && sums[i].Epochs != 2 {
			t.Errorf("peer %d: %+v", i, sums[i])
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for g, members := range w.formed[1:] {
		if slices.Contains(members, "peer-5") {
			t.Errorf("generation %d holds the liar again: %v\n%s", g+2, members, log)
		}
	}
	if len(w.formed) < 2 || !slices.Contains(w.dropped, "peer-5") {
		t.Errorf("rings %v, dropped %v; want a ring without peer-5, which its stage named\n%s", w.formed, w.dropped, log)
	}
	// Its membership keeps it out after: started again, it is no standby.
	if !slices.Contains(w.distrusted, "peer-5") {
		t.Errorf("distrusted %v; want peer-5 kept out of later rings", w.distrusted)
	}
}

func TestPlanStages(t *testing.T) {
	tests := []struct {
		table    []int
		replicas int
		replica  []int
		empty    bool
	}{
		{[]int{0, 0, 1, 1}, 2, []int{0, 1, 0, 1}, false},
		{[]int{0, 0, 1}, 1, []int{0, -1, 0}, false},             // stage 1 lost one: stage 0's second waits
		{[]int{1, 0, 0, 1, 1}, 2, []int{0, 0, 1, 1, -1}, false}, // ranks as the new ring has them
		{[]int{0, 0}, 0, nil, true},                             // stage 1 has nobody
	}
	for _, tt := range tests {
		p, err := planStages(tt.table, 2)
		if tt.empty {
			if !errors.Is(err, errEmptyStage) {
				t.Errorf("%v: %v; want errEmptyStage", tt.table, err)
			}
			continue
		}
		if err != nil || p.replicas != tt.replicas || !slices.Equal(p.replica, tt.replica) {
			t.Errorf("%v: %+v, %v; want %d replicas, %v", tt.table, p, err, tt.replicas, tt.replica)
		}
	}
	if _, err := planStages([]int{0, 5}, 2); err == nil {
		t.Error("a member claiming stage 5 of 2 was planned")
	}
}

func TestPlaceNewcomers(t *testing.T) {
	tests := []struct{ table, want []int }{
		{[]int{0, -1}, []int{0, 1}},
		{[]int{-1, 0, 1, 1}, []int{0, 0, 1, 1}},
		{[]int{-1, -1, 1}, []int{0, 0, 1}},
		{[]int{0, 1}, []int{0, 1}},
	}
	for _, tt := range tests {
		if got := placeNewcomers(tt.table, 2); !slices.Equal(got, tt.want) {
			t.Errorf("placeNewcomers(%v) = %v; want %v", tt.table, got, tt.want)
		}
	}
}

func TestCommonStep(t *testing.T) {
	one := stagePlan{stage: []int{0, 1, 0}, replica: []int{0, 0, -1}, replicas: 1}
	two := stagePlan{stage: []int{0, 0, 1, 1}, replica: []int{0, 1, 0, 1}, replicas: 2}
	tests := []struct {
		plan stagePlan
		held []float32 // step+1, two slots a rank
		want int
	}{
		{one, []float32{21, 41, 21, 41, 0, 0}, 40},  // both hold 20 and 40
		{one, []float32{21, 41, 1, 21, 0, 0}, 20},   // one snapshot later than the other's newest
		{one, []float32{21, 41, 0, 0, 0, 0}, 40},    // stage 1 held by a newcomer alone: its own checkpoint
		{one, []float32{21, 41, 61, 81, 0, 0}, -1},  // nothing in common
		{one, []float32{21, 41, 21, 41, 99, 0}, 40}, // a spare's slots do not count
		{two, []float32{21, 41, 0, 0, 21, 41, 21, 41}, 40},
		// Rank 1 a spare again active, its snapshots stale: it takes its
		// stage's state from rank 0.
		{two, []float32{2342, 2358, 1782, 1787, 2342, 2358, 2342, 2358}, 2357},
		{two, []float32{21, 41, 21, 41, 1, 11, 0, 0}, -1}, // stage 1 holds none of stage 0's steps
	}
	for _, tt := range tests {
		if got := commonStep(tt.held, tt.plan); got != tt.want {
			t.Errorf("commonStep(%v) = %d; want %d", tt.held, got, tt.want)
		}
	}
}
