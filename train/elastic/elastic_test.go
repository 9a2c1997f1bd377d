package elastic

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// fixedRing is a Membership whose first ring is given and never changes:
// no peer is lost, leaves or arrives.
type fixedRing struct {
	r     *ring.Ring
	names []string
}

func (f *fixedRing) Form(context.Context) (*ring.Ring, bool, error) { return f.r, false, nil }
func (f *fixedRing) Reform(context.Context, int, []int) (*ring.Ring, error) {
	return nil, errors.New("fixedRing: no re-formation")
}
func (f *fixedRing) Grow(context.Context, []string, bool, int) (*ring.Ring, error) {
	return nil, errors.New("fixedRing: no growth")
}
func (f *fixedRing) Standbys() []string    { return nil }
func (f *fixedRing) Distrust([]string)     {}
func (f *fixedRing) Ended(context.Context) {}
func (f *fixedRing) Members() []string     { return f.names }

// lockedBuffer is a log both peers write to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// runJobs runs one Job per checkpoint path on an in-memory ring of that
// many peers (a path of "" is a peer without a checkpoint_dir), training
// epochs of the test subset, and returns their summaries and the log.
func runJobs(t *testing.T, epochs int, checkpoints []string, seeds []uint64) ([]train.Summary, []error, string) {
	t.Helper()
	n := len(checkpoints)
	ts := ring.MemRing(n)
	cfg, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	split, err := cfg.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	var log lockedBuffer
	sums := make([]train.Summary, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		r, err := ring.New(ts[i], ring.Config{Rank: i, Size: n, Generation: 1})
		if err != nil {
			t.Fatal(err)
		}
		spec := train.ModelConfig{Spec: train.MLPSpec(784, []int{16}, 10), Batch: 16, Seed: seeds[i]}
		m, err := train.NewModel(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		names := make([]string, n)
		for k := range names {
			names[k] = fmt.Sprintf("peer-%d", k)
		}
		job := &Job{Members: &fixedRing{r: r, names: names}, WorldSize: n, StepTimeout: 20 * time.Second,
			Checkpoint: checkpoints[i], CheckpointBase: train.Checkpoint{Model: spec, Seed: 1, Classes: split.Classes},
			Logger: zerolog.New(&log).With().Int("peer", i).Logger()}
		job.Training = train.RunConfig{Replica: train.NewReplica(m, &train.SGD{LR: 0.05, Momentum: 0.9}, nil), Epochs: epochs, Classes: 10,
			Train: &data.Loader{Split: split, BatchSize: 16, Seed: 1, Sampler: data.Sampler{N: split.Len(), World: 1, Seed: 1, Shuffle: true}}}
		wg.Go(func() { sums[i], errs[i] = job.Run(context.Background()) })
	}
	wg.Wait()
	return sums, errs, log.String()
}

// TestPeersDifferingInCheckpointDirAgree: whether a peer has a
// checkpoint_dir is its own machine's setting, so peers may differ in it —
// and they still agree where to start: with no checkpoint anywhere they
// start afresh, together; with one on the peer that has the dir, both
// resume from it; either way the ring trains, and the log names the peer
// without one.
func TestPeersDifferingInCheckpointDirAgree(t *testing.T) {
	dir := t.TempDir()
	ckpt := filepath.Join(dir, "j.ckpt")
	seeds := []uint64{1, 1}
	sums, errs, _ := runJobs(t, 1, []string{ckpt, ""}, seeds)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("one epoch, one peer with a checkpoint_dir: %v", err)
	}
	if sums[0].ParamHash != sums[1].ParamHash {
		t.Fatalf("the peers end apart: %s, %s", sums[0].ParamHash, sums[1].ParamHash)
	}
	// The checkpoint of epoch 1 is there; two epochs resume from it, on
	// both peers — the one without a dir takes it from the other.
	sums2, errs, log := runJobs(t, 2, []string{ckpt, ""}, []uint64{7, 8})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("resuming, one peer with a checkpoint: %v\n%s", err, log)
	}
	if sums2[0].ParamHash != sums2[1].ParamHash {
		t.Fatalf("the resumed peers end apart")
	}
	if strings.Count(log, "resuming from a checkpoint") != 2 || !strings.Contains(log, `"peers_without":["peer-1"]`) {
		t.Fatalf("both peers should resume, and name the peer without a checkpoint:\n%s", log)
	}
	// The same the other way round: the peer with the dir is rank 1.
	_, errs, log = runJobs(t, 2, []string{"", filepath.Join(t.TempDir(), "j.ckpt")}, seeds)
	if err := errors.Join(errs...); err != nil || strings.Contains(log, "resuming") {
		t.Fatalf("no checkpoint anywhere: %v; want a fresh start\n%s", err, log)
	}
}

// TestCheckpointFarAheadIsNotTaken: a checkpoint that claims to be far
// ahead of the ones the other peers hold — planted in a peer's directory,
// or made up — is not what the job resumes from: the peers resume from
// the ones they agree on, and the log names the peer that claimed more.
func TestCheckpointFarAheadIsNotTaken(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir(), t.TempDir()}
	paths := make([]string, 3)
	for i, d := range dirs {
		paths[i] = filepath.Join(d, "j.ckpt")
	}
	seeds := []uint64{1, 1, 1}
	straight, errs, _ := runJobs(t, 2, []string{"", "", ""}, seeds)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if _, errs, _ := runJobs(t, 1, paths, seeds); errors.Join(errs...) != nil {
		t.Fatal(errors.Join(errs...))
	}
	// Peer 2's checkpoint is made to claim 500 more steps, with other
	// parameters.
	forged, err := train.LoadCheckpoint(paths[2])
	if err != nil {
		t.Fatal(err)
	}
	forged.Step += 500
	for _, p := range forged.Params {
		for k := range p {
			p[k] = 0.5
		}
	}
	if err := forged.Save(paths[2]); err != nil {
		t.Fatal(err)
	}
	sums, errs, log := runJobs(t, 2, paths, []uint64{5, 6, 7})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	for i, s := range sums {
		if s.ParamHash != straight[0].ParamHash {
			t.Errorf("peer %d ends at %s; an uninterrupted run at %s (the forged checkpoint was taken?)", i, s.ParamHash[:16], straight[0].ParamHash[:16])
		}
	}
	if !strings.Contains(log, `"peers":["peer-2"]`) || !strings.Contains(log, "not taken") {
		t.Errorf("the log should name peer-2's claim as not taken:\n%s", log)
	}
}

// TestNoShowsWait: a standby admitted that did not come is not admitted
// again for a second, then two, doubling to half a minute; others are
// admitted meanwhile.
func TestNoShowsWait(t *testing.T) {
	t0 := time.Unix(1000, 0)
	n := noShows{}
	for _, tc := range []struct {
		missedAt time.Duration
		wait     time.Duration
	}{
		{0, time.Second}, {time.Second, 2 * time.Second}, {3 * time.Second, 4 * time.Second},
		{7 * time.Second, 8 * time.Second}, {15 * time.Second, 16 * time.Second}, {31 * time.Second, 30 * time.Second}, {61 * time.Second, 30 * time.Second},
	} {
		at := t0.Add(tc.missedAt)
		n.missed("a", at)
		if n.ready("a", at.Add(tc.wait-time.Millisecond)) || !n.ready("a", at.Add(tc.wait)) {
			t.Errorf("missed at %v: ready before %v or not after it", tc.missedAt, tc.wait)
		}
		if !n.ready("b", at) {
			t.Errorf("missed at %v: another standby held back", tc.missedAt)
		}
	}
}
