package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/train/sparse"
)

// stepModel is a model of one tensor whose gradient is g at every step, so
// that an inner SGD step of LR 1 moves every parameter by −g and a round's
// pseudo-gradient is its steps times g. hook, if set, runs at the start of
// each ForwardBackward with its number, from 1: a test holds a rank there.
type stepModel struct {
	p, grad []float32
	g       float32
	steps   int
	hook    func(step int)
}

func newStepModel(g float32, hook func(int)) *stepModel {
	return &stepModel{p: make([]float32, 4), grad: make([]float32, 4), g: g, hook: hook}
}

func (m *stepModel) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	m.steps++
	if m.hook != nil {
		m.hook(m.steps)
	}
	for i := range m.grad {
		m.grad[i] = m.g
	}
	return 1, nil
}
func (m *stepModel) Forward(x []float32, y []int, n int) (float32, error) { return 1, nil }
func (m *stepModel) Params() [][]float32                                  { return [][]float32{m.p} }
func (m *stepModel) Grads() [][]float32                                   { return [][]float32{m.grad} }
func (m *stepModel) ParamNames() []string                                 { return []string{"w"} }
func (m *stepModel) Logits() []float32                                    { return nil }
func (m *stepModel) Close() error                                         { return nil }

// fakeTimer is a Deadline's clock that the test drives: each deadline
// that begins comes on armed, and passes when the test closes it.
type fakeTimer struct{ armed chan chan time.Time }

func newFakeTimer() *fakeTimer { return &fakeTimer{armed: make(chan chan time.Time, 16)} }

func (f *fakeTimer) after(time.Duration) <-chan time.Time {
	c := make(chan time.Time)
	f.armed <- c
	return c
}

// TestQuorumLateRankFoldsIntoNextRound: four ranks, a round every 4 steps,
// rank 3 held in its third step when the others close round 1. Its
// deadline passes twice (overdue, then late), so round 1 closes with ranks 0–2 (the average of their
// 4, 8 and 12); rank 3 catches up from that round's result and, in round
// 2, sends all 8 of its steps (32) beside the others' 4, 8 and 12. Every
// rank ends at the same bits: 0 − 8 − 14. With a quorum of 4, round 1 is
// skipped on every rank, nothing is lost, and round 2 averages 8, 16, 24
// and 32.
func TestQuorumLateRankFoldsIntoNextRound(t *testing.T) {
	for _, tc := range []struct {
		quorum int
		want   float32
		outer  int
		round1 error // what ranks 0–2's fourth step returns
	}{
		{quorum: 3, want: -22, outer: 2},
		{quorum: 4, want: -20, outer: 1, round1: ErrNoQuorum},
	} {
		const n, h = 4, 4
		rings := memRings(t, n)
		timer := newFakeTimer()
		r3in3, r3go := make(chan struct{}), make(chan struct{})
		// No rank posts a round before every rank due in it is in the
		// step where it is due: one that saw another's post first would
		// post early, with the steps it had.
		in4, in8 := newBarrier(3), newBarrier(4)
		othersIn5 := make(chan struct{}, n)
		go func() {
			close(<-timer.armed) // round 1's deadline passes on rank 3, held in step 3: overdue
			close(<-timer.armed) // and the next: late
			for range 3 {
				<-othersIn5 // round 1 has closed on ranks 0–2: rank 3 is late
			}
			close(r3go)
		}()
		end := make([][]float32, n)
		outer := make([]int, n)
		err := onAll(n, func(i int) error {
			hook := func(step int) {
				switch {
				case i == 3 && step == 3:
					close(r3in3)
					<-r3go
				case i < 3 && step == 4:
					<-r3in3 // rank 3 is held when the others close round 1
					in4()
				case i < 3 && step == 5:
					othersIn5 <- struct{}{}
				case step == 8:
					in8()
				}
			}
			o := &LocalSGD{Inner: &SGD{LR: 1}, Every: h, LR: 1, Deadline: time.Hour, Quorum: tc.quorum}
			rep := NewLocalReplica(newStepModel(float32(i+1), hook), o, rings[i])
			if i == 3 {
				rep.Sync.(*deadlineRounds).after = timer.after
			}
			for s := 1; s <= 2*h; s++ {
				_, err := rep.Step(context.Background(), nil, nil, 1)
				if i < 3 && s == h {
					if !errors.Is(err, tc.round1) {
						t.Errorf("quorum %d: rank %d step %d: %v; want %v", tc.quorum, i, s, err, tc.round1)
					}
					continue
				}
				if err != nil && !(tc.round1 != nil && errors.Is(err, tc.round1)) {
					return err
				}
			}
			end[i] = slices.Concat(rep.Model.Params()...)
			_, outer[i], _ = rep.OptimizerState()
			return nil
		})
		if err != nil {
			t.Fatalf("quorum %d: %v", tc.quorum, err)
		}
		for i := range n {
			for _, v := range end[i] {
				if v != tc.want {
					t.Fatalf("quorum %d: rank %d ends at %v; want every parameter at %v", tc.quorum, i, end[i], tc.want)
				}
			}
			if outer[i] != tc.outer {
				t.Errorf("quorum %d: rank %d took %d outer steps; want %d", tc.quorum, i, outer[i], tc.outer)
			}
		}
	}
}

// TestQuorumBehindRankPostsAtOnce: four ranks, a round every 4 steps,
// rank 3's steps an hour each by its clock and the Deadline a minute.
// When the others begin round 1 it is in its third step: by its step time
// it cannot reach its fourth within the Deadline, so it is overdue at
// once and posts its three steps (12) at the end of the third, with no
// deadline passing: round 1 averages 4, 8, 12 and 12. It computes its
// fourth step only once round 1's exchange, which passes through it, has
// ended. Ranks 0–2 end round 2 with the same bits (rank 3 may carry a
// step into a round 3 no one runs, if round 2 came before its last).
func TestQuorumBehindRankPostsAtOnce(t *testing.T) {
	const n, h = 4, 4
	rings := memRings(t, n)
	timer := newFakeTimer()
	var clock time.Time
	hourly := func() time.Time { clock = clock.Add(time.Hour); return clock }
	var r0 []float32
	end := make([][]float32, n)
	err := onAll(n, func(i int) error {
		var d *deadlineRounds
		hook := func(step int) {
			switch {
			case i == 3 && step == 3:
				<-timer.armed // round 1 came while it computed its third step
			case i == 3 && step == 4:
				if x := d.qx; x != nil && x.k == 1 {
					t.Errorf("rank 3 computes its fourth step with round 1's exchange under way")
				}
			}
		}
		o := &LocalSGD{Inner: &SGD{LR: 1}, Every: h, LR: 1, Deadline: time.Minute}
		rep := NewLocalReplica(newStepModel(float32(i+1), hook), o, rings[i])
		d = rep.Sync.(*deadlineRounds)
		if i == 3 {
			d.after, d.now = timer.after, hourly
		}
		for s := 1; s <= 2*h; s++ {
			if _, err := rep.Step(context.Background(), nil, nil, 1); err != nil {
				return fmt.Errorf("rank %d step %d: %w", i, s, err)
			}
			if i == 0 && s == h {
				r0 = slices.Clone(rep.Model.Params()[0])
			}
		}
		end[i] = slices.Concat(rep.Model.Params()...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range r0 {
		if v != -9 {
			t.Fatalf("after round 1 rank 0 holds %v; want every parameter at -9 (the average of 4, 8, 12 and rank 3's three steps, 12)", r0)
		}
	}
	for i := range 3 {
		if !slices.Equal(end[i], end[0]) {
			t.Fatalf("rank %d ends at %v, rank 0 at %v", i, end[i], end[0])
		}
	}
}

// newBarrier is a function that returns once n calls have been made.
func newBarrier(n int) func() {
	var mu sync.Mutex
	all := make(chan struct{})
	return func() {
		mu.Lock()
		if n--; n == 0 {
			close(all)
		}
		mu.Unlock()
		<-all
	}
}

// TestQuorumRunWithSlowRank: Run with rounds by deadline and one rank
// twenty times slower than the others. Rounds close without it, the epoch
// ends for it at the last round, every rank ends both epochs with the
// same parameters, and no sample is reported trained twice. The slow rank
// trains fewer samples than the others: the others never wait for it
// beyond its step under way. The same with sparse pseudo-gradients, where
// a late rank sends no payload.
func TestQuorumRunWithSlowRank(t *testing.T) {
	if testing.Short() {
		t.Skip("trains two epochs on four ranks")
	}
	for _, sp := range []*sparse.Config{nil, {Fraction: 0.05, Bits: 4}} {
		t.Run(fmt.Sprintf("sparse %v", sp != nil), func(t *testing.T) { quorumRunWithSlowRank(t, sp) })
	}
}

func quorumRunWithSlowRank(t *testing.T, sp *sparse.Config) {
	const world, batch = 4, 8
	rings := memRings(t, world)
	seen := &seenCount{n: map[int]int{}}
	sums := make([]Summary, world)
	err := onAll(world, func(i int) error {
		var m Model = newMLP(t, mlpCfg(784, []int{8}, 10, batch, 1))
		if i == 3 {
			m = slowModel{Model: m, d: 20 * time.Millisecond}
		}
		o := &LocalSGD{Inner: &SGD{LR: 0.1}, Every: 4, LR: 1, Deadline: time.Millisecond, Quorum: 2, Sparse: sp}
		rep := NewLocalReplica(m, o, rings[i])
		var err error
		sums[i], err = Run(context.Background(), RunConfig{Replica: rep, Train: loader(t, "train", batch, true), Epochs: 2, Classes: 10,
			Trained: seen.add})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range world {
		if sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("rank %d ends with hash %s, rank 0 with %s", i, sums[i].ParamHash, sums[0].ParamHash)
		}
	}
	for k, c := range seen.n {
		if c > 2 {
			t.Fatalf("sample %d reported %d times in 2 epochs", k, c)
		}
	}
	if sums[3].Trained >= sums[0].Trained {
		t.Errorf("the slow rank trained %d samples, rank 0 %d; want fewer", sums[3].Trained, sums[0].Trained)
	}
	t.Logf("samples trained by rank: %d %d %d %d", sums[0].Trained, sums[1].Trained, sums[2].Trained, sums[3].Trained)
}

// TestCheckAnchors: each rank's two hash slots, averaged over the ring,
// give back its anchor's hash; a rank whose hash differs from most is
// named, and so is one whose slots hold no hash or a value no rank can
// write. Without a majority the error names no liar.
func TestCheckAnchors(t *testing.T) {
	h := func(b byte) [2]float32 { return hashSlots([32]byte{b, 0xff, 0x00, b}) }
	averaged := func(hs ...[2]float32) []float32 {
		slots := make([]float32, 2*len(hs))
		for k, s := range hs {
			slots[2*k] += s[0] / float32(len(hs))
			slots[2*k+1] += s[1] / float32(len(hs))
		}
		return slots
	}
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name  string
		slots []float32
		liars []int // nil: no LiarError
		fails bool
	}{
		{"all alike, four", averaged(h(7), h(7), h(7), h(7)), nil, false},
		{"all alike, three", averaged(h(0xff), h(0xff), h(0xff)), nil, false},
		{"rank 2 differs", averaged(h(7), h(7), h(8), h(7)), []int{2}, true},
		{"rank 0 differs", averaged(h(9), h(7), h(7)), []int{0}, true},
		{"no majority", averaged(h(1), h(2)), nil, true},
		{"an empty slot", averaged(h(7), [2]float32{}, h(7)), []int{1}, true},
		{"past 16 bits", averaged(h(7), h(7), [2]float32{70000, 1}), []int{2}, true},
		{"not whole", averaged(h(7), [2]float32{3.5, 1}, h(7)), []int{1}, true},
		{"NaN", averaged(h(7), h(7), [2]float32{nan, 1}), []int{2}, true},
	} {
		err := checkAnchors(tc.slots, len(tc.slots)/2)
		var liar *LiarError
		switch {
		case !tc.fails && err != nil:
			t.Errorf("%s: %v; want nil", tc.name, err)
		case tc.fails && err == nil:
			t.Errorf("%s: nil; want an error", tc.name)
		case tc.liars != nil && (!errors.As(err, &liar) || !slices.Equal(liar.Ranks, tc.liars)):
			t.Errorf("%s: %v; want ranks %v named", tc.name, err, tc.liars)
		case tc.liars == nil && errors.As(err, &liar):
			t.Errorf("%s: %v; want no rank named", tc.name, err)
		}
	}
}
