package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
)

// TestLocalSGDWithH1IsSynchronous: DiLoCo with one inner step a round,
// plain inner SGD and an outer SGD of lr 1 without momentum is synchronous
// SGD: the average of the ranks' changes, −lr·g each, is −lr times the
// averaged gradient. The same to float rounding, the same bits on every
// rank.
func TestLocalSGDWithH1IsSynchronous(t *testing.T) {
	const n, steps = 3, 6
	cfg := mlpCfg(12, []int{16}, 3, 4, 1)
	params := map[bool][][]float32{}
	for _, local := range []bool{false, true} {
		rings := memRings(t, n)
		params[local] = make([][]float32, n)
		err := onAll(n, func(i int) error {
			var opt any = &SGD{LR: 0.1}
			if local {
				opt = &LocalSGD{Inner: &SGD{LR: 0.1}, Every: 1, LR: 1}
			}
			rep := newReplica(newMLP(t, cfg), opt, rings[i])
			rng := rand.New(rand.NewPCG(5, uint64(i)))
			for range steps {
				x, y := randomBatch(rng, 4, 12, 3)
				if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
					return err
				}
			}
			params[local][i] = slices.Concat(rep.Model.Params()...)
			return nil
		})
		if err != nil {
			t.Fatalf("local %v: %v", local, err)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(params[local][i], params[local][0]) {
				t.Errorf("local %v: rank %d's parameters differ from rank 0's", local, i)
			}
		}
	}
	for j, want := range params[false][0] {
		if got := params[true][0][j]; math.Abs(float64(got-want)) > 1e-5*max(1, math.Abs(float64(want))) {
			t.Fatalf("parameter %d = %v with H=1, %v synchronous", j, got, want)
		}
	}
}

// TestLocalSGDRounds: with H=4 the ranks do not talk between outer steps
// (their parameters differ mid-round), agree to the bit after each, and
// send about a quarter of synchronous training's bytes; Nesterov's outer
// momentum is kept as the optimizer's state.
func TestLocalSGDRounds(t *testing.T) {
	const n, h = 3, 4
	cfg := mlpCfg(12, []int{64}, 3, 4, 1)
	sent := map[int]int64{}
	for _, every := range []int{0, h} {
		rings := memRings(t, n)
		mid := make([][]float32, n)
		end := make([][]float32, n)
		err := onAll(n, func(i int) error {
			var opt any = NewAdam(0.01)
			if every > 0 {
				opt = &LocalSGD{Inner: NewAdam(0.01), Every: every, LR: 0.7, Momentum: 0.9, Nesterov: true}
			}
			rep := newReplica(newMLP(t, cfg), opt, rings[i])
			rng := rand.New(rand.NewPCG(5, uint64(i)))
			for s := range 2 * h {
				x, y := randomBatch(rng, 4, 12, 3)
				if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
					return err
				}
				if s == h+1 {
					mid[i] = slices.Concat(rep.Model.Params()...)
				}
			}
			end[i] = slices.Concat(rep.Model.Params()...)
			if i == 0 {
				sent[every] = rep.Stats.BytesSent
			}
			if every > 0 {
				name, outer, state := rep.OptimizerState()
				if name != "diloco+adam" || outer != 2 || len(state) != len(rep.Model.Params()) {
					t.Errorf("state %s after %d outer steps with %d tensors; want diloco+adam, 2, %d", name, outer, len(state), len(rep.Model.Params()))
				}
			}
			return nil
		})
		if err != nil {
			t.Fatalf("every %d: %v", every, err)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(end[i], end[0]) {
				t.Errorf("every %d: rank %d ends with other parameters than rank 0", every, i)
			}
			if every > 0 && slices.Equal(mid[i], mid[0]) {
				t.Errorf("every %d: rank %d holds rank 0's parameters mid-round; want its own", every, i)
			}
		}
	}
	if r := float64(sent[h]) / float64(sent[0]); r > 1.1/h {
		t.Errorf("H=%d sent %d bytes, synchronous %d (%.2f); want about 1/%d", h, sent[h], sent[0], r, h)
	}
}

// failsAt is a Collective whose n-th AllreduceMean fails, as when a peer
// is lost.
type failsAt struct {
	*ring.Ring
	n int
}

var errLostPeer = errors.New("peer lost (fake)")

func (f *failsAt) AllreduceMean(ctx context.Context, buf []float32) error {
	if f.n--; f.n == 0 {
		return errLostPeer
	}
	return f.Ring.AllreduceMean(ctx, buf)
}

// TestLocalSGDRoundUndone: an outer step whose allreduce fails takes the
// whole round back — the parameters return to the anchor, the step count
// to the round's start, and Step says how many steps to run again — so the
// survivors can redo it.
func TestLocalSGDRoundUndone(t *testing.T) {
	cfg := mlpCfg(12, []int{8}, 3, 4, 1)
	rep := NewLocalReplica(newMLP(t, cfg), &LocalSGD{Inner: &SGD{LR: 0.1}, Every: 3, LR: 1}, &failsAt{Ring: solo(t), n: 1})
	// A ring of one does not fail: make it look like one of two.
	rep.Coll = sized{rep.Coll, 2}
	anchor := slices.Concat(rep.Model.Params()...)
	rng := rand.New(rand.NewPCG(5, 1))
	var err error
	for range 3 {
		x, y := randomBatch(rng, 4, 12, 3)
		if _, err = rep.Step(context.Background(), x, y, 4); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrCollective) || !errors.Is(err, errLostPeer) {
		t.Fatalf("the outer step: %v; want ErrCollective", err)
	}
	if got := slices.Concat(rep.Model.Params()...); !slices.Equal(got, anchor) {
		t.Error("after the failed outer step the parameters are not the round's start")
	}
	if rep.Steps != 0 || rep.out.undone != 3 || rep.roundOpen() {
		t.Errorf("steps %d, undone %d, round open %v; want 0, 3, false", rep.Steps, rep.out.undone, rep.roundOpen())
	}
}

// sized makes a Collective report another size.
type sized struct {
	Collective
	size int
}

func (s sized) Size() int { return s.size }

// TestLocalSGDResumeIsExact: a DiLoCo run stopped at a checkpoint and
// resumed by fresh replicas ends with the bits of the run that went on —
// the checkpoint holds the outer momentum and is written between rounds
// only (SaveEvery 2 with rounds of 3: at steps 6, 12, …).
func TestLocalSGDResumeIsExact(t *testing.T) {
	const world, batch = 2, 8
	cfg := mlpCfg(784, []int{16}, 10, batch, 1)
	newOpt := func() *LocalSGD {
		return &LocalSGD{Inner: NewAdam(0.003), Every: 3, LR: 0.7, Momentum: 0.9, Nesterov: true}
	}
	run := func(reps []*Replica, start Position, epochs int, save func(int, Position) error) []Summary {
		t.Helper()
		rings := memRings(t, world)
		sums := make([]Summary, world)
		err := onAll(world, func(i int) error {
			reps[i].Coll = rings[i]
			var err error
			sums[i], err = Run(context.Background(), RunConfig{Replica: reps[i], Train: loader(t, "train", batch, true),
				Epochs: epochs, Classes: 10, Start: start, SaveEvery: 2, Save: func(p Position) error { return save(i, p) }})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return sums
	}
	fresh := func() []*Replica {
		reps := make([]*Replica, world)
		for i := range reps {
			reps[i] = NewLocalReplica(newMLP(t, cfg), newOpt(), nil)
		}
		return reps
	}
	var ckpt *Checkpoint
	var saved []int
	whole := run(fresh(), Position{}, 2, func(i int, p Position) error {
		if i == 0 {
			saved = append(saved, p.Steps)
		}
		return nil
	})
	reps := fresh()
	run(reps, Position{}, 1, func(i int, p Position) error {
		if i == 0 && p.Epochs == 1 && p.Skip == 0 {
			ckpt = reps[0].Snapshot(Checkpoint{Model: cfg, Epoch: p.Epochs, Step: p.Steps})
		}
		return nil
	})
	// 2000 samples / (2 × 8): 125 steps an epoch, rounds of 3 from each
	// epoch's start (the last one short).
	for _, s := range saved {
		if (s%125)%3 != 0 {
			t.Errorf("a checkpoint at step %d: inside a round of 3", s)
		}
	}
	if len(saved) < 30 {
		t.Errorf("%d checkpoints in 250 steps; want one every 6 steps", len(saved))
	}
	if ckpt == nil {
		t.Fatal("no checkpoint at the epoch's end")
	}
	if ckpt.Optimizer != "diloco+adam" || len(ckpt.OptState) == 0 {
		t.Fatalf("the epoch's checkpoint holds %s with %d state tensors; want diloco+adam with the outer momentum", ckpt.Optimizer, len(ckpt.OptState))
	}
	reps = fresh()
	for _, r := range reps {
		if err := r.Restore(ckpt); err != nil {
			t.Fatal(err)
		}
	}
	resumed := run(reps, Position{Epochs: ckpt.Epoch, Steps: ckpt.Step}, 2, func(int, Position) error { return nil })
	for i := range world {
		if resumed[i].ParamHash != whole[0].ParamHash {
			t.Errorf("rank %d: resumed run ends with hash %s, the whole run %s", i, resumed[i].ParamHash[:12], whole[0].ParamHash[:12])
		}
	}
}

// twin is rank 0 of a ring of two whose other rank is its double: an
// AllreduceSum of a table of rows gives row 1 what row 0 holds.
type twin struct{ Collective }

func (w twin) AllreduceSum(ctx context.Context, buf []float32) error {
	copy(buf[len(buf)/2:], buf[:len(buf)/2])
	return nil
}

// TestLocalSGDReportsEverySampleOnce: with LocalSGD the indices of a
// round's steps are reported once its outer step is done; the loader
// reuses its batches meanwhile, so what is held back must be a copy —
// else the report repeats the last batch's indices and loses the others.
func TestLocalSGDReportsEverySampleOnce(t *testing.T) {
	const world, batch = 2, 8
	rings := memRings(t, world)
	seen := &seenCount{n: map[int]int{}}
	err := onAll(world, func(i int) error {
		rep := NewLocalReplica(newMLP(t, mlpCfg(784, []int{8}, 10, batch, 1)), &LocalSGD{Inner: &SGD{LR: 0.1}, Every: 4, LR: 1}, rings[i])
		_, err := Run(context.Background(), RunConfig{Replica: rep, Train: loader(t, "train", batch, true), Epochs: 1, Classes: 10,
			Trained: seen.add})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for k := range 2000 {
		if seen.n[k] != 1 {
			t.Fatalf("sample %d reported %d times", k, seen.n[k])
		}
	}
}
