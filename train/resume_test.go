package train

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
)

// TestResumeFromAnyRank: of three ranks, the two that hold checkpoints
// offer them; every rank ends with the most advanced one's parameters,
// optimizer state and position, whichever rank that is — and with none,
// all start afresh.
func TestResumeFromAnyRank(t *testing.T) {
	const world = 3
	cfg := mlpCfg(20, []int{8}, 4, 4, 1)
	// Two checkpoints of a few Adam steps: 5 and 9 steps in.
	ckpt := func(steps int) *Checkpoint {
		rep := NewReplica(newMLP(t, cfg), NewAdam(0.01), solo(t))
		for range steps {
			x, y := randomBatch(newRand(uint64(steps)), 4, 20, 4)
			if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
				t.Fatal(err)
			}
		}
		return rep.Snapshot(Checkpoint{Model: cfg, Epoch: 1, Step: steps, Skip: 12})
	}
	five, nine := ckpt(5), ckpt(9)
	for _, tc := range []struct {
		name    string
		held    [world]*Checkpoint
		root    int
		want    *Checkpoint
		refused []int
	}{
		{"the latest on ranks 1 and 2, a stale one on 0", [world]*Checkpoint{five, nine, nine}, 1, nine, nil},
		{"the latest on rank 0, none on 1", [world]*Checkpoint{nine, nil, nine}, 0, nine, nil},
		{"a tie goes to the lowest rank", [world]*Checkpoint{nil, five, five}, 1, five, nil},
		{"one alone is taken", [world]*Checkpoint{nil, nil, nine}, 2, nine, nil},
		// A claim four steps ahead of the others' is not taken on its word.
		{"one far ahead of the others", [world]*Checkpoint{five, five, nine}, 0, five, []int{2}},
		{"one far ahead of one other: the lower is the median", [world]*Checkpoint{nine, nil, five}, 2, five, []int{0}},
		{"none", [world]*Checkpoint{}, -1, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, world)
			reps := make([]*Replica, world)
			pos := make([]Position, world)
			roots := make([]int, world)
			refused := make([][]int, world)
			err := onAll(world, func(i int) error {
				other := cfg
				other.Seed = uint64(10 + i) // a fresh start differs on every rank
				reps[i] = NewReplica(newMLP(t, other), NewAdam(0.01), rings[i])
				if c := tc.held[i]; c != nil {
					if err := reps[i].Restore(c); err != nil {
						return err
					}
				}
				res, err := reps[i].Resume(context.Background(), tc.held[i])
				pos[i], roots[i], refused[i] = res.Position, res.From, res.Refused
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for i, rep := range reps {
				if !slices.Equal(refused[i], tc.refused) {
					t.Errorf("rank %d: refused the claims of ranks %v; want %v", i, refused[i], tc.refused)
				}
				if roots[i] != tc.root {
					t.Errorf("rank %d: resumed from rank %d; want %d", i, roots[i], tc.root)
				}
				if tc.want == nil {
					if pos[i] != (Position{}) {
						t.Errorf("rank %d: position %+v with no checkpoint anywhere", i, pos[i])
					}
					continue
				}
				if want := (Position{Epochs: 1, Steps: tc.want.Step, Skip: 12}); pos[i] != want {
					t.Errorf("rank %d: position %+v; want %+v", i, pos[i], want)
				}
				for k, p := range rep.Model.Params() {
					if !slices.Equal(p, tc.want.Params[k]) {
						t.Fatalf("rank %d: parameter %d differs from the checkpoint's", i, k)
					}
				}
				_, step, state := rep.Opt.State()
				if step != tc.want.OptStep || len(state) != len(tc.want.OptState) {
					t.Fatalf("rank %d: optimizer at step %d with %d tensors; want %d and %d", i, step, len(state), tc.want.OptStep, len(tc.want.OptState))
				}
				for k := range state {
					if !slices.Equal(state[k], tc.want.OptState[k]) {
						t.Fatalf("rank %d: optimizer tensor %d differs from the checkpoint's", i, k)
					}
				}
			}
		})
	}
}

func newRand(seed uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, 1)) }
