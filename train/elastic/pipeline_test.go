package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/pipeline"
)

// fabric is an in-memory StageNet for n peers: the ring of all, a ring per
// set of ranks asked for, and a pair of pipes per boundary.
type fabric struct {
	n     int
	mu    sync.Mutex
	world []ring.Transport
	rings map[string][]ring.Transport
	pipes map[[2]int][2]io.ReadWriteCloser // [lower, higher] → the ends
}

func newFabric(n int) *fabric {
	return &fabric{n: n, world: ring.MemRing(n), rings: map[string][]ring.Transport{}, pipes: map[[2]int][2]io.ReadWriteCloser{}}
}

type fabricPeer struct {
	f    *fabric
	rank int
}

func (p *fabricPeer) Form(context.Context) (*ring.Ring, bool, error) {
	r, err := ring.New(p.f.world[p.rank], ring.Config{Rank: p.rank, Size: p.f.n, Generation: 1})
	return r, false, err
}
func (p *fabricPeer) Reform(context.Context, int, []int) (*ring.Ring, error) {
	return nil, errors.New("fabric: no re-formation")
}
func (p *fabricPeer) Grow(context.Context, []string, bool, int) (*ring.Ring, error) {
	return nil, errors.New("fabric: no growth")
}
func (p *fabricPeer) Standbys() []string { return nil }
func (p *fabricPeer) Members() []string {
	out := make([]string, p.f.n)
	for i := range out {
		out[i] = fmt.Sprintf("peer-%d", i)
	}
	return out
}

func (p *fabricPeer) StageRing(_ context.Context, ranks []int) (*ring.Ring, error) {
	p.f.mu.Lock()
	key := fmt.Sprint(ranks)
	ts, ok := p.f.rings[key]
	if !ok {
		ts = ring.MemRing(len(ranks))
		p.f.rings[key] = ts
	}
	p.f.mu.Unlock()
	for i, r := range ranks {
		if r == p.rank {
			return ring.New(ts[i], ring.Config{Rank: i, Size: len(ranks), Generation: 1})
		}
	}
	return nil, fmt.Errorf("rank %d not in %v", p.rank, ranks)
}

func (p *fabricPeer) end(other int) io.ReadWriteCloser {
	if other < 0 {
		return nil
	}
	lo, hi := min(p.rank, other), max(p.rank, other)
	p.f.mu.Lock()
	defer p.f.mu.Unlock()
	ends, ok := p.f.pipes[[2]int{lo, hi}]
	if !ok {
		ar, aw := io.Pipe()
		br, bw := io.Pipe()
		ends = [2]io.ReadWriteCloser{pipeEnd{aw, br}, pipeEnd{bw, ar}}
		p.f.pipes[[2]int{lo, hi}] = ends
	}
	if p.rank == lo {
		return ends[0]
	}
	return ends[1]
}

func (p *fabricPeer) Boundary(_ context.Context, prev, next int) (io.ReadWriteCloser, io.ReadWriteCloser, error) {
	return p.end(prev), p.end(next), nil
}

type pipeEnd struct {
	w *io.PipeWriter
	r *io.PipeReader
}

func (e pipeEnd) Read(b []byte) (int, error)  { return e.r.Read(b) }
func (e pipeEnd) Write(b []byte) (int, error) { return e.w.Write(b) }
func (e pipeEnd) Close() error                { e.w.Close(); return e.r.Close() }

// pipelineRun runs a pipeline job of n peers on the test subset; stopAt,
// if not negative, cancels peer stopPeer's context once it has done that
// many steps.
func pipelineRun(t *testing.T, n int, cfg pipeline.Config, stopPeer, stopAt int) ([]PipelineSummary, []error, string, string) {
	t.Helper()
	return pipelineRunIn(t, filepath.Join(t.TempDir(), "model.ckpt"), n, cfg, stopPeer, stopAt)
}

// pipelineRunIn is pipelineRun with the checkpoints at ckpt.
func pipelineRunIn(t *testing.T, ckpt string, n int, cfg pipeline.Config, stopPeer, stopAt int) ([]PipelineSummary, []error, string, string) {
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
	f := newFabric(n)
	var log lockedBuffer
	sums := make([]PipelineSummary, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		job := &PipelineJob{Members: &fabricPeer{f: f, rank: i}, Pipeline: cfg, Model: model, StepTimeout: 20 * time.Second,
			Checkpoint: ckpt, CheckpointBase: train.Checkpoint{Seed: 3, Classes: split.Classes},
			Logger: zerolog.New(&log).With().Int("peer", i).Logger(), Out: &log,
			NewReplica: func(m train.Model) (*train.Replica, error) {
				return train.NewReplica(m, &train.SGD{LR: 0.05, Momentum: 0.9}, nil), nil
			}}
		job.Training = train.RunConfig{Epochs: 2, Classes: 10, ProgressEvery: 1,
			Train: &data.Loader{Split: split, BatchSize: 16, Seed: 1, Sampler: data.Sampler{N: split.Len(), World: 1, Seed: 1, Shuffle: true}},
			Test:  &data.Loader{Split: test, BatchSize: 16, Seed: 1, Sampler: data.Sampler{N: test.Len(), World: 1, Seed: 1, Exact: true}}}
		if i == stopPeer {
			job.Training.Progress = func(p train.Progress) {
				if !p.EpochDone && p.Stats.Steps >= stopAt {
					cancel()
				}
			}
		}
		wg.Go(func() { sums[i], errs[i] = job.Run(ctx) })
	}
	wg.Wait()
	return sums, errs, log.String(), ckpt
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
func TestPipelineJobStopsTogether(t *testing.T) {
	for _, asker := range []int{0, 3} {
		t.Run(fmt.Sprint(asker), func(t *testing.T) {
			sums, errs, log, ckpt := pipelineRun(t, 4, pipeline.Config{Stages: 2, MicroBatches: 4, Split: []int{3}}, asker, 5)
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
	stopped, _, log, _ := pipelineRunIn(t, ckpt, 4, cfg, 2, 7)
	if stopped[0].Steps < 7 || stopped[0].Steps >= whole[0].Steps {
		t.Fatalf("stopped after %d steps of %d\n%s", stopped[0].Steps, whole[0].Steps, log)
	}
	again, errs, log, _ := pipelineRunIn(t, ckpt, 4, cfg, -1, 0)
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
	_, errs, _, _ = pipelineRunIn(t, ckpt, 4, cfg, -1, 0)
	for i, err := range errs {
		if !errors.Is(err, train.ErrCheckpoint) {
			t.Errorf("peer %d: %v; want stages at different steps refused", i, err)
		}
	}
}
