package train

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// errKilled is how the dying rank's run ends.
var errKilled = errors.New("killed")

// dying is a rank that vanishes in the middle of its n-th allreduce, as a
// SIGKILLed process would: its links close under the neighbours' feet.
type dying struct {
	*ring.Ring
	n    int // dies in its n-th AllreduceMean (a step), if n > 0
	sums int // or in its sums-th AllreduceSum (the epoch's end), if sums > 0
}

func (d *dying) AllreduceMean(ctx context.Context, buf []float32) error {
	if d.n--; d.n == 0 {
		d.Ring.Close()
		return errKilled
	}
	return d.Ring.AllreduceMean(ctx, buf)
}

func (d *dying) AllreduceSum(ctx context.Context, buf []float32) error {
	if d.sums--; d.sums == 0 {
		d.Ring.Close()
		return errKilled
	}
	return d.Ring.AllreduceSum(ctx, buf)
}

// errDeviceLost is what a lost GPU's failing call looks like to a step.
var errDeviceLost = errors.New("engine: training step on cuda:0: CUDA_ERROR_ILLEGAL_ADDRESS (fake)")

// lostDevice is a model whose device fails in its n-th ForwardBackward.
type lostDevice struct {
	Model
	n int
}

func (m *lostDevice) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	if m.n--; m.n == 0 {
		return 0, errDeviceLost
	}
	return m.Model.ForwardBackward(x, y, n)
}

// rendezvous is a fake of the survivors' re-formation: once `want` ranks
// have asked, it builds a new in-memory ring of them, ranked in their old
// order, in generation 2.
type rendezvous struct {
	t       *testing.T
	want    int
	mu      sync.Mutex
	waiting map[int]chan Collective // by old rank
	at      []Position
}

func (z *rendezvous) reform(oldRank int, at Position) (Collective, error) {
	ch := make(chan Collective, 1)
	z.mu.Lock()
	z.waiting[oldRank] = ch
	z.at = append(z.at, at)
	if len(z.waiting) == z.want {
		var olds []int
		for r := range z.waiting {
			olds = append(olds, r)
		}
		slices.Sort(olds)
		ts := ring.MemRing(z.want)
		for i, old := range olds {
			r, err := ring.New(ts[i], ring.Config{Rank: i, Size: z.want, Generation: 2})
			if err != nil {
				z.t.Error(err)
			}
			z.t.Cleanup(func() { r.Close() })
			z.waiting[old] <- r
		}
	}
	z.mu.Unlock()
	select {
	case c := <-ch:
		return c, nil
	case <-time.After(time.Minute): // a survivor never came: fail, not hang
		return nil, errors.New("rendezvous: the other survivors did not come")
	}
}

// carryOn runs cfg as an elastic job's owner does (train/elastic), with
// change making the next ring after each interruption: the replicas are
// brought level and the run goes on from where they agree, until it ends
// or this rank leaves, dies or is caught lying.
func carryOn(ctx context.Context, cfg RunConfig, minSize int, change func(cause error, at Position) (Collective, error)) (Summary, error) {
	var total Summary
	r := cfg.Replica
	for {
		s, err := Run(ctx, cfg)
		total = total.Then(s)
		var in *Interrupted
		var leave *LeaveError
		if !errors.As(err, &in) || errors.As(err, &leave) && (slices.Contains(leave.Ranks, r.Coll.Rank()) || !leave.OthersCarryOn(r.Coll.Size(), minSize)) {
			return total, err
		}
		for cause := in.Cause; ; {
			c, err := change(cause, in.At)
			if err != nil {
				return total, err
			}
			r.Coll = c
			pos, err := r.Level(ctx, in.At, !errors.Is(cause, ErrNewcomer))
			var liar *LiarError
			if errors.As(err, &liar) && slices.Contains(liar.Ranks, r.Coll.Rank()) {
				return total, err
			}
			if err == nil {
				in.Unapplied.Report(pos, cfg)
				cfg.Start, cfg.InSync = pos, true
				break
			}
			cause = err
		}
	}
}

// TestSurvivorsFinish: rank 2 of 4 dies in the middle of an allreduce in
// the first epoch; the other three re-form, share out the rest of the epoch,
// run the interrupted step again and finish both epochs with the same
// parameters — and each learns where the ring broke, the same for all.
func TestSurvivorsFinish(t *testing.T) {
	for _, tc := range []struct {
		name  string
		kill  dying
		fault int
		at    Position
	}{
		{"in a step's allreduce", dying{n: 7}, 0, Position{Epochs: 0, Steps: 6, Skip: 6 * 4 * 8}},
		// 2000 samples / (4 × 8) = 63 steps, the last one short.
		{"at the epoch's end", dying{sums: 1}, 0, Position{Epochs: 0, Steps: 63, Skip: 2000}},
		// Its GPU fails in step 7: its run ends with the device's error,
		// its process exits (closing its links), and the others go on as
		// from any lost peer.
		{"its device lost", dying{}, 7, Position{Epochs: 0, Steps: 6, Skip: 6 * 4 * 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			survivorsFinish(t, tc.kill, tc.fault, tc.at, func() any { return NewAdam(0.003) })
		})
	}
	// With DiLoCo, rounds of 4 steps: rank 2 dies in the second outer
	// step's allreduce (step 8). The survivors go back to the round's
	// start, step 4, and redo the round among themselves.
	t.Run("local SGD: in an outer step", func(t *testing.T) {
		survivorsFinish(t, dying{n: 2}, 0, Position{Epochs: 0, Steps: 4, Skip: 4 * 4 * 8}, func() any {
			return &LocalSGD{Inner: NewAdam(0.003), Every: 4, LR: 0.7, Momentum: 0.9, Nesterov: true}
		})
	})
	// Streaming, two fragments of rounds of 8 overlapping a step:
	// exchanges begin after steps 4 and 8; rank 2 dies in the second, the
	// others find it failed at step 9, take back steps 8 and 9, bring
	// every fragment back to its anchor and go on from step 7.
	// With a deadline the same: no rank is behind, so no round closes
	// without one, and the survivors redo the round from its start.
	t.Run("local SGD with a deadline: in an outer step", func(t *testing.T) {
		survivorsFinish(t, dying{n: 2}, 0, Position{Epochs: 0, Steps: 4, Skip: 4 * 4 * 8}, func() any {
			return &LocalSGD{Inner: NewAdam(0.003), Every: 4, LR: 0.7, Momentum: 0.9, Nesterov: true, Deadline: time.Hour, Quorum: 3}
		})
	})
	t.Run("streaming local SGD: in an exchange", func(t *testing.T) {
		survivorsFinish(t, dying{n: 2}, 0, Position{Epochs: 0, Steps: 7, Skip: 7 * 4 * 8}, func() any {
			return &LocalSGD{Inner: NewAdam(0.003), Every: 8, LR: 1, Fragments: 2, Overlap: 1}
		})
	})
}

func survivorsFinish(t *testing.T, kill dying, fault int, wantAt Position, newOpt func() any) {
	const world, batch = 4, 8
	rings := memRings(t, world)
	z := &rendezvous{t: t, want: world - 1, waiting: map[int]chan Collective{}}
	sums := make([]Summary, world)
	errs := make([]error, world)
	hashes := make([][32]byte, world)
	onAll(world, func(i int) error {
		var coll Collective = rings[i]
		model := newMLP(t, mlpCfg(784, []int{16}, 10, batch, 1))
		if i == 2 && fault > 0 {
			model = &lostDevice{Model: model, n: fault}
			defer rings[i].Close() // the process exits
		} else if i == 2 {
			d := kill
			d.Ring = rings[i]
			coll = &d
		}
		rep := newReplica(model, newOpt(), coll)
		tr := loader(t, "train", batch, true)
		te := loader(t, "test", batch, false)
		te.Sampler.Exact = true
		sums[i], errs[i] = carryOn(context.Background(), RunConfig{Replica: rep, Train: tr, Test: te, Epochs: 2, Classes: 10}, world-1,
			func(cause error, at Position) (Collective, error) {
				if i == 2 { // dead: a killed process re-forms nothing
					return nil, errKilled
				}
				if !errors.Is(cause, ErrCollective) {
					t.Errorf("rank %d re-forms for %v; want ErrCollective", i, cause)
				}
				return z.reform(i, at)
			})
		hashes[i] = rep.ParamHash()
		return nil
	})
	if want := map[bool]error{true: errDeviceLost, false: errKilled}[fault > 0]; !errors.Is(errs[2], want) {
		t.Errorf("the dying rank's run: %v; want %v", errs[2], want)
	}
	for _, i := range []int{0, 1, 3} {
		if errs[i] != nil {
			t.Fatalf("survivor %d: %v", i, errs[i])
		}
		if hashes[i] != hashes[0] || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("survivor %d ends with other parameters than survivor 0", i)
		}
		if sums[i].Epochs != 2 || sums[i].TestSamples != 500 {
			t.Errorf("survivor %d: %d epochs, %d test samples scored; want 2 and 500", i, sums[i].Epochs, sums[i].TestSamples)
		}
	}
	for _, at := range z.at {
		if at != wantAt {
			t.Errorf("a survivor re-formed at %+v; want %+v", at, wantAt)
		}
	}
	// Four ranks throughout reach 0.77 here; a survivor that trained on
	// the wrong share or the wrong state would fall well below.
	if sums[0].TestAccuracy < 0.7 {
		t.Errorf("test accuracy %.3f after losing a rank (per epoch %v); want ≥ 0.7", sums[0].TestAccuracy, sums[0].EpochAccuracy)
	}
}

// failsAfter is a rank whose n-th step's allreduce completes — every rank
// has its gradients — but fails here, as when a peer goes just after the
// last frame this rank needed reached the others but before its own last
// frame reached it.
type failsAfter struct {
	*ring.Ring
	n int
}

func (f *failsAfter) AllreduceMean(ctx context.Context, buf []float32) error {
	err := f.Ring.AllreduceMean(ctx, buf)
	if f.n--; f.n == 0 && err == nil {
		return fmt.Errorf("%w: the last frame lost (fake)", ErrCollective)
	}
	return err
}

// TestAppliedElsewhereIsCounted: rank 3's step 7 fails on it alone; the
// others applied it, with rank 3's gradients, and lose it in step 8. All
// level at step 7: rank 3's batch of step 7 was trained, though not on
// its own run, and must be counted once — every sample of every epoch
// once (it was counted by no one, and a churned job's count came out
// short). The other ranks' whole blocks must count every sample once
// without rank 3's reports: a peer SIGKILLed just after its gradients went
// into a step the others applied never reports its batch.
func TestAppliedElsewhereIsCounted(t *testing.T) {
	const world, batch, epochs = 4, 8, 2
	rings := memRings(t, world)
	z := &rendezvous{t: t, want: world, waiting: map[int]chan Collective{}}
	seen := newEpochCounts(epochs)
	blocks := newBlockCounts(epochs) // ranks 0–2's only: as if rank 3's reports were lost with it
	errs := make([]error, world)
	onAll(world, func(i int) error {
		var coll Collective = rings[i]
		if i == 3 {
			coll = &failsAfter{Ring: rings[i], n: 7}
		}
		rep := newReplica(newMLP(t, mlpCfg(784, []int{16}, 10, batch, 1)), NewAdam(0.003), coll)
		cfg := RunConfig{Replica: rep, Train: loader(t, "train", batch, true), Epochs: epochs, Classes: 10, Trained: seen.add}
		if i != 3 {
			cfg.Blocks = blocks.add
		}
		_, errs[i] = carryOn(context.Background(), cfg, world, func(cause error, at Position) (Collective, error) {
			if i == 3 {
				rings[i].Close() // the others find the ring broken in their next step
			}
			return z.reform(i, at)
		})
		return nil
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	if !slices.Contains(z.at, Position{Epochs: 0, Steps: 7, Skip: 7 * world * batch}) || !slices.Contains(z.at, Position{Epochs: 0, Steps: 6, Skip: 6 * world * batch}) {
		t.Fatalf("the ranks re-formed at %+v; want rank 3 at step 6 and the others at step 7", z.at)
	}
	n := loader(t, "train", batch, true).Sampler.N
	seen.check(t, n)
	blocks.check(t, n)
}

// blockCounts counts, from RunConfig.Blocks, which block (by its first
// position) trained each sample of each epoch; every rank reports every
// block, so only a sample in two different blocks is trained twice.
type blockCounts struct {
	mu    sync.Mutex
	from  []map[int]int
	twice []string
}

func newBlockCounts(epochs int) *blockCounts {
	c := &blockCounts{from: make([]map[int]int, epochs)}
	for e := range c.from {
		c.from[e] = map[int]int{}
	}
	return c
}

func (c *blockCounts) add(epoch, from int, index []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range index {
		if f, ok := c.from[epoch][k]; ok && f != from {
			c.twice = append(c.twice, fmt.Sprintf("epoch %d: sample %d in the blocks from %d and %d", epoch+1, k, f, from))
		}
		c.from[epoch][k] = from
	}
}

func (c *blockCounts) check(t *testing.T, n int) {
	t.Helper()
	for _, s := range c.twice {
		t.Error(s)
	}
	for e, got := range c.from {
		if len(got) != n {
			t.Errorf("epoch %d: %d of %d samples in the reported blocks", e+1, len(got), n)
		}
	}
}

// epochCounts counts how many times each sample of each epoch was
// trained (RunConfig.Trained).
type epochCounts struct {
	mu   sync.Mutex
	seen []map[int]int
}

func newEpochCounts(epochs int) *epochCounts {
	c := &epochCounts{seen: make([]map[int]int, epochs)}
	for e := range c.seen {
		c.seen[e] = map[int]int{}
	}
	return c
}

func (c *epochCounts) add(epoch int, index []int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range index {
		c.seen[epoch][k]++
	}
}

// check fails t unless every one of the n samples was trained once in
// every epoch.
func (c *epochCounts) check(t *testing.T, n int) {
	t.Helper()
	for e, got := range c.seen {
		missing := 0
		for k := range n {
			if got[k] > 1 {
				t.Errorf("epoch %d: sample %d trained %d times", e+1, k, got[k])
			}
			if got[k] == 0 {
				missing++
			}
		}
		if missing > 0 || len(got) > n {
			t.Errorf("epoch %d: %d of %d samples never trained, %d outside the dataset", e+1, missing, n, len(got)+missing-n)
		}
	}
}

// TestLeaverGoesOthersStay: rank 1 of 4 asks to leave; with three enough
// (MinSize 3), it stops after the step that told the others, and they
// re-form without it, from the position after that step, and finish in
// step. With MinSize 4 everyone stops instead (TestOneRankStopsAll).
//
// With streaming DiLoCo the request rides the next exchange (beginning
// after step 8) and is heard when it ends, after step 9.
func TestLeaverGoesOthersStay(t *testing.T) {
	t.Run("sgd", func(t *testing.T) {
		leaverGoesOthersStay(t, func() any { return &SGD{LR: 0.05} }, 6)
	})
	t.Run("local SGD with a deadline", func(t *testing.T) {
		leaverGoesOthersStay(t, func() any {
			return &LocalSGD{Inner: &SGD{LR: 0.05}, Every: 8, LR: 1, Deadline: time.Hour, Quorum: 3}
		}, 8)
	})
	t.Run("streaming local SGD", func(t *testing.T) {
		leaverGoesOthersStay(t, func() any {
			return &LocalSGD{Inner: &SGD{LR: 0.05}, Every: 8, LR: 1, Fragments: 2, Overlap: 1}
		}, 9)
	})
}

func leaverGoesOthersStay(t *testing.T, newOpt func() any, stopsAfter int) {
	const world, batch = 4, 8
	rings := memRings(t, world)
	z := &rendezvous{t: t, want: world - 1, waiting: map[int]chan Collective{}}
	stop := make(chan struct{})
	sums := make([]Summary, world)
	errs := make([]error, world)
	onAll(world, func(i int) error {
		rep := newReplica(newMLP(t, mlpCfg(784, []int{16}, 10, batch, 1)), newOpt(), rings[i])
		cfg := RunConfig{Replica: rep, Train: loader(t, "train", batch, true), Epochs: 2, Classes: 10}
		change := func(cause error, at Position) (Collective, error) {
			var leave *LeaveError
			if !errors.As(cause, &leave) || !slices.Equal(leave.Ranks, []int{1}) || i == 1 {
				t.Errorf("rank %d re-forms for %v", i, cause)
			}
			return z.reform(i, at)
		}
		if i == 1 {
			cfg.Stop, cfg.ProgressEvery = stop, 5
			cfg.Progress = func(p Progress) {
				if p.Step == 5 {
					close(stop)
				}
			}
		}
		sums[i], errs[i] = carryOn(context.Background(), cfg, 3, change)
		return nil
	})
	if !errors.Is(errs[1], ErrStopped) || sums[1].Steps != stopsAfter {
		t.Errorf("the leaver: %v after %d steps; want ErrStopped after %d", errs[1], sums[1].Steps, stopsAfter)
	}
	for _, at := range z.at {
		if want := (Position{Steps: stopsAfter, Skip: stopsAfter * world * batch}); at != want {
			t.Errorf("re-formed at %+v; want %+v (after the leaver's last step)", at, want)
		}
	}
	for _, i := range []int{0, 2, 3} {
		if errs[i] != nil || sums[i].Epochs != 2 || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("rank %d: %v, %d epochs, hash %s; want 2 epochs and rank 0's hash", i, errs[i], sums[i].Epochs, sums[i].ParamHash)
		}
	}
}

// TestNewcomerIsAdmitted: three ranks train; in the middle of the first
// epoch rank 0 hears that a newcomer waits. After that step every rank
// stops, the ring grows to four, the newcomer catches up (parameters,
// optimizer state, position) from the others through it, and the rest of
// the epoch is shared out among four: every sample of every epoch is
// trained exactly once, and all four finish with the same parameters.
//
// With streaming DiLoCo the newcomer's knock rides the exchange that
// begins at that step and is heard when it ends, a step later; every
// rank settles at its anchors, which the newcomer takes. With rounds by
// deadline it rides the round that closes at step 24.
func TestNewcomerIsAdmitted(t *testing.T) {
	t.Run("adam", func(t *testing.T) {
		newcomerIsAdmitted(t, func() any { return NewAdam(0.01) }, 0)
	})
	t.Run("local SGD with a deadline", func(t *testing.T) {
		newcomerIsAdmitted(t, func() any {
			return &LocalSGD{Inner: NewAdam(0.01), Every: 8, LR: 1, Deadline: time.Hour}
		}, 4)
	})
	t.Run("streaming local SGD", func(t *testing.T) {
		newcomerIsAdmitted(t, func() any {
			return &LocalSGD{Inner: NewAdam(0.01), Every: 8, LR: 1, Fragments: 2, Overlap: 1}
		}, 1)
	})
}

func newcomerIsAdmitted(t *testing.T, newOpt func() any, heardAfter int) {
	const batch, epochs, knockAt = 8, 2, 20
	rings := memRings(t, 3)
	grown := ring.MemRing(4)
	newRing := func(rank int) Collective {
		r, err := ring.New(grown[rank], ring.Config{Rank: rank, Size: 4, Generation: 2})
		if err != nil {
			t.Error(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	sums := make([]Summary, 4)
	errs := make([]error, 4)
	var mu sync.Mutex
	seen, blocks := newEpochCounts(epochs), newBlockCounts(epochs)
	var grewAt []Position
	onAll(4, func(i int) error {
		m := newMLP(t, mlpCfg(784, []int{16}, 10, batch, uint64(1+i)))
		cfg := RunConfig{Train: loader(t, "train", batch, true), Epochs: epochs, Classes: 10, Trained: seen.add, Blocks: blocks.add}
		if i == 3 { // the newcomer
			cfg.Replica = newReplica(m, newOpt(), newRing(3))
			pos, err := cfg.Replica.Admitted(context.Background())
			if err != nil {
				errs[i] = err
				return nil
			}
			cfg.Start, cfg.InSync = pos, true
			sums[i], errs[i] = Run(context.Background(), cfg)
			return nil
		}
		cfg.Replica = newReplica(m, newOpt(), rings[i])
		if i == 0 {
			// The first step at knockAt or after that talks to the ring
			// (a round's, with LocalSGD) carries the knock.
			knocked := false
			cfg.Replica.Waiting = func() bool {
				knocked = knocked || cfg.Replica.Steps >= knockAt
				return knocked && cfg.Replica.Coll.Size() == 3
			}
		}
		sums[i], errs[i] = carryOn(context.Background(), cfg, 3, func(cause error, at Position) (Collective, error) {
			if !errors.Is(cause, ErrNewcomer) {
				return nil, fmt.Errorf("rank %d: the ring changes for %w; want ErrNewcomer", i, cause)
			}
			mu.Lock()
			grewAt = append(grewAt, at)
			mu.Unlock()
			return newRing(i), nil
		})
		return nil
	})
	for i := range 4 {
		if errs[i] != nil || sums[i].Epochs != epochs || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("rank %d: %v, %d epochs, hash %.16s; want %d epochs and rank 0's %.16s", i, errs[i], sums[i].Epochs, sums[i].ParamHash, epochs, sums[0].ParamHash)
		}
	}
	if sums[3].Steps != sums[0].Steps {
		t.Errorf("the newcomer counts %d steps, the others %d", sums[3].Steps, sums[0].Steps)
	}
	want := Position{Epochs: 0, Steps: knockAt + heardAfter, Skip: (knockAt + heardAfter) * 3 * batch}
	if len(grewAt) != 3 || slices.ContainsFunc(grewAt, func(p Position) bool { return p != want }) {
		t.Errorf("the ring grew at %+v; want at %+v on each of the three", grewAt, want)
	}
	seen.check(t, loader(t, "train", batch, true).Sampler.N)
	blocks.check(t, loader(t, "train", batch, true).Sampler.N)
}
