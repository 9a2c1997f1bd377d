package train

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// lying is a rank that runs its own code: it claims to be ahead in the
// state comparison of a re-formation, or sends other parameters than it
// declared.
type lying struct {
	Collective
	ahead    int  // steps added to its claimed position
	tamper   bool // alters the parameters it broadcasts as root
	declared bool // set once its row has gone out
}

func (l *lying) AllreduceSum(ctx context.Context, buf []float32) error {
	if w := msgWidth(maxClaimBytes); len(buf) == l.Size()*w {
		row := buf[l.Rank()*w : (l.Rank()+1)*w]
		var c claim
		if ok, err := getMsg(row, &c, maxClaimBytes); ok && err == nil && l.ahead > 0 {
			c.Steps += l.ahead
			if err := putMsg(row, &c, maxClaimBytes); err != nil {
				return err
			}
		}
		l.declared = true
	}
	return l.Collective.AllreduceSum(ctx, buf)
}

func (l *lying) Broadcast(ctx context.Context, buf []float32, root int) error {
	if l.tamper && l.declared && root == l.Rank() && len(buf) > 1 && len(buf) != msgWidth(maxShapeBytes) { // parameters, not the optimizer's shape
		buf = slices.Clone(buf)
		buf[0] += 1
	}
	return l.Collective.Broadcast(ctx, buf, root)
}

// adoptOn runs adoptLatest on n replicas of one model over an in-memory
// ring, rank liar wrapped in l, every rank at position at (rank liar one
// step on if ahead1).
func adoptOn(t *testing.T, n, liar int, l lying, at Position, maxAhead int, ahead1 bool) []error {
	t.Helper()
	rings := memRings(t, n)
	errs := make([]error, n)
	onAll(n, func(i int) error {
		var c Collective = rings[i]
		mine := at
		if i == liar {
			l.Collective = rings[i]
			c = &l
			if ahead1 {
				mine.Steps++
			}
		}
		rep := NewReplica(newMLP(t, mlpCfg(4, []int{3}, 2, 2, 1)), &SGD{LR: 0.1}, c)
		_, _, errs[i] = rep.adoptLatest(context.Background(), true, mine, maxAhead)
		return nil
	})
	return errs
}

// TestAdoptionCatchesLiars: a rank that claims to be far ahead of the others
// at a re-formation, or that sends other parameters than the hash it
// declared, is named on every rank and nothing is adopted from it. Before
// these checks every rank took the claimant's state and position.
func TestAdoptionCatchesLiars(t *testing.T) {
	at := Position{Epochs: 1, Steps: 40, Skip: 8}
	for _, tc := range []struct {
		name     string
		l        lying
		maxAhead int
		ahead1   bool
	}{
		{"claims 1000 steps ahead at a re-formation", lying{ahead: 1000}, 1, false},
		{"claims 1 step ahead at an epoch's end (admission)", lying{ahead: 1}, 0, false},
		{"sends other parameters than it declared", lying{tamper: true}, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := adoptOn(t, 4, 2, tc.l, at, tc.maxAhead, tc.ahead1)
			for i, err := range errs {
				if i == 2 && tc.l.tamper {
					continue // the root does not check what it sent itself
				}
				var liar *LiarError
				if !errors.As(err, &liar) || !slices.Equal(liar.Ranks, []int{2}) {
					t.Errorf("rank %d: adoptLatest = %v; want rank 2 named", i, err)
				}
			}
		})
	}
	// An honest survivor one step on is adopted.
	for i, err := range adoptOn(t, 4, 2, lying{}, at, 1, true) {
		if err != nil {
			t.Errorf("rank %d: adoptLatest with an honest rank one step on = %v", i, err)
		}
	}
}

// TestCheckInSyncNamesTheOddOne: of three replicas, the one whose
// parameters differ is named, not the two that agree; of two that differ,
// none is blamed.
func TestCheckInSyncNamesTheOddOne(t *testing.T) {
	for _, tc := range []struct {
		n, odd int
		want   []int // nil: an error that blames nobody
	}{
		{3, 0, []int{0}},
		{3, 2, []int{2}},
		{2, 1, nil},
	} {
		rings := memRings(t, tc.n)
		errs := make([]error, tc.n)
		onAll(tc.n, func(i int) error {
			m := newMLP(t, mlpCfg(4, []int{3}, 2, 2, 1))
			if i == tc.odd {
				m.Params()[0][0] += 1
			}
			errs[i] = NewReplica(m, &SGD{LR: 0.1}, rings[i]).CheckInSync(context.Background())
			return nil
		})
		for i, err := range errs {
			var liar *LiarError
			switch {
			case tc.want != nil && (!errors.As(err, &liar) || !slices.Equal(liar.Ranks, tc.want)):
				t.Errorf("%d ranks, rank %d odd: rank %d's CheckInSync = %v; want %v named", tc.n, tc.odd, i, err, tc.want)
			case tc.want == nil && (err == nil || errors.As(err, &liar)):
				t.Errorf("%d ranks, rank %d odd: rank %d's CheckInSync = %v; want an error naming no liar", tc.n, tc.odd, i, err)
			}
		}
	}
}

// regroup fakes re-formations that can happen more than once: the ranks
// that ask in round k get a fresh in-memory ring of the size the first of
// them says, ranked by their original index.
type regroup struct {
	t      *testing.T
	mu     sync.Mutex
	rounds map[int]map[int]chan Collective // round → original index → answer
}

func (g *regroup) join(round, want, id int) (Collective, error) {
	ch := make(chan Collective, 1)
	g.mu.Lock()
	if g.rounds[round] == nil {
		g.rounds[round] = map[int]chan Collective{}
	}
	w := g.rounds[round]
	w[id] = ch
	if len(w) == want {
		ids := make([]int, 0, want)
		for k := range w {
			ids = append(ids, k)
		}
		slices.Sort(ids)
		ts := ring.MemRing(want)
		for r, k := range ids {
			rg, err := ring.New(ts[r], ring.Config{Rank: r, Size: want, Generation: uint64(round + 1)})
			if err != nil {
				g.t.Error(err)
			}
			g.t.Cleanup(func() { rg.Close() })
			w[k] <- rg
		}
	}
	g.mu.Unlock()
	select {
	case c := <-ch:
		return c, nil
	case <-time.After(time.Minute):
		return nil, errors.New("regroup: the others did not come")
	}
}

// TestLiarIsDroppedAndTheOthersFinish: rank 1 of 4 leaves; at the
// re-formation rank 3 claims to be 1000 steps ahead. The other two name it,
// re-form without it and finish both epochs with the same parameters; the
// liar's run ends with its lie named. Before, everyone adopted its claim.
func TestLiarIsDroppedAndTheOthersFinish(t *testing.T) {
	const world, batch = 4, 8
	rings := memRings(t, world)
	g := &regroup{t: t, rounds: map[int]map[int]chan Collective{}}
	stop := make(chan struct{})
	sums := make([]Summary, world)
	errs := make([]error, world)
	onAll(world, func(i int) error {
		var c Collective = rings[i]
		var liar *lying
		if i == 3 {
			liar = &lying{Collective: rings[i]}
			c = liar
		}
		rep := NewReplica(newMLP(t, mlpCfg(784, []int{16}, 10, batch, 1)), &SGD{LR: 0.05}, c)
		round, size := 0, world
		cfg := RunConfig{Replica: rep, Train: loader(t, "train", batch, true), Epochs: 2, Classes: 10}
		change := func(cause error, at Position) (Collective, error) {
			var leave *LeaveError
			var lie *LiarError
			switch {
			case errors.As(cause, &leave):
				size -= len(leave.Ranks)
			case errors.As(cause, &lie):
				size -= len(lie.Ranks)
			default:
				t.Errorf("rank %d re-forms for %v", i, cause)
			}
			round++
			next, err := g.join(round, size, i)
			if liar != nil && err == nil {
				liar.Collective, liar.ahead = next, 1000
				return liar, nil
			}
			return next, err
		}
		if i == 1 {
			cfg.Stop, cfg.ProgressEvery = stop, 5
			cfg.Progress = func(p Progress) {
				if p.Step == 5 {
					close(stop)
				}
			}
		}
		sums[i], errs[i] = carryOn(context.Background(), cfg, 2, change)
		return nil
	})
	if !errors.Is(errs[1], ErrStopped) {
		t.Errorf("the leaver: %v; want ErrStopped", errs[1])
	}
	if lie := (*LiarError)(nil); !errors.As(errs[3], &lie) || !slices.Equal(lie.Ranks, []int{2}) {
		t.Errorf("the liar's run: %v; want its lie named (rank 2 of the second generation)", errs[3])
	}
	for _, i := range []int{0, 2} {
		if errs[i] != nil || sums[i].Epochs != 2 || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("rank %d: %v, %d epochs, hash %.16s; want 2 epochs and rank 0's hash", i, errs[i], sums[i].Epochs, sums[i].ParamHash)
		}
	}
}

// failing is a collective whose every call fails, as a ring does where a
// peer keeps breaking it.
type failing struct{ size int }

var errBroken = errors.New("broken")

func (f failing) AllreduceMean(context.Context, []float32) error           { return errBroken }
func (f failing) AllreduceSum(context.Context, []float32) error            { return errBroken }
func (f failing) Broadcast(_ context.Context, _ []float32, root int) error { return nil }
func (f failing) Rank() int                                                { return 0 }
func (f failing) Size() int                                                { return f.size }

// TestBroadcastStrings: a list goes out as sent; a root that sends more,
// or longer, than the bounds, or garbage, is an error on every rank.
func TestBroadcastStrings(t *testing.T) {
	rings := memRings(t, 3)
	got := make([][]string, 3)
	errs := make([]error, 3)
	onAll(3, func(i int) error {
		var send []string
		if i == 1 {
			send = []string{"12D3KooWabc", "", "x"}
		}
		got[i], errs[i] = BroadcastStrings(context.Background(), rings[i], 1, send, 4, 16)
		return nil
	})
	for i := range 3 {
		if errs[i] != nil || !slices.Equal(got[i], []string{"12D3KooWabc", "", "x"}) {
			t.Errorf("rank %d: %q, %v", i, got[i], errs[i])
		}
	}
	for _, garbage := range [][]float32{{5}, {1, 99}, {1, 1, 300}, {1, 1, 0.5}, {-1}} {
		g := garbled{vals: garbage}
		if _, err := BroadcastStrings(context.Background(), g, 0, nil, 4, 16); err == nil {
			t.Errorf("a broadcast of %v read without an error", garbage)
		}
	}
}

// garbled is a rank-1 view of a root that sends vals.
type garbled struct {
	failing
	vals []float32
}

func (g garbled) Broadcast(_ context.Context, buf []float32, _ int) error {
	clear(buf)
	copy(buf, g.vals)
	return nil
}
func (g garbled) Rank() int { return 1 }

// hidingNaN is a rank that sends a NaN gradient with its non-finite flag at
// 0.
type hidingNaN struct{ Collective }

func (h hidingNaN) AllreduceMean(ctx context.Context, buf []float32) error {
	buf[0] = float32(math.NaN())
	return h.Collective.AllreduceMean(ctx, buf)
}

// TestHiddenNaNIsSkipped: a NaN that a rank sends while flagging its own
// gradients finite is not applied on any rank. Before the check of the
// average, every rank applied it, and the hash check passed, as all held
// the same NaN.
func TestHiddenNaNIsSkipped(t *testing.T) {
	const n = 3
	rings := memRings(t, n)
	cfg := mlpCfg(12, []int{8}, 3, 2, 1)
	x, y := randomBatch(rand.New(rand.NewPCG(1, 2)), 2, 12, 3)
	errs := make([]error, n)
	onAll(n, func(i int) error {
		var c Collective = rings[i]
		if i == 1 {
			c = hidingNaN{rings[i]}
		}
		rep := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, c)
		before := slices.Clone(rep.Model.Params()[0])
		if _, errs[i] = rep.Step(context.Background(), x, y, 2); !slices.Equal(before, rep.Model.Params()[0]) {
			t.Errorf("rank %d: parameters changed by a step with a hidden NaN", i)
		}
		return nil
	})
	for i, err := range errs {
		if !errors.Is(err, ErrNonFinite) {
			t.Errorf("rank %d: Step = %v; want ErrNonFinite", i, err)
		}
	}
}

// leaveForger is a rank that adds add to rank victim's leave slot in every
// step's allreduce, and cut to the length of the victim's answer in the
// confirmation round (to cancel a denial).
type leaveForger struct {
	Collective
	victim  int
	add     float32
	nparams int
	cut     float32
}

func (f leaveForger) AllreduceSum(ctx context.Context, buf []float32) error {
	if w := msgWidth(maxLeaveAnswerBytes); f.cut != 0 && len(buf) == f.Size()*w {
		buf[f.victim*w] -= f.cut
	}
	return f.Collective.AllreduceSum(ctx, buf)
}

func (f leaveForger) AllreduceMean(ctx context.Context, buf []float32) error {
	if len(buf) == f.nparams+stepTrailer(f.Size(), false) {
		buf[f.nparams+stepFlags+f.victim] += f.add
	}
	return f.Collective.AllreduceMean(ctx, buf)
}

// TestForgedLeaveIsIgnored: a member that sets another rank's leave slot
// cannot make it stop — the victim denies the request and every rank
// carries on together, counting it — and a member that cancels a real
// request cannot keep its maker in: the maker leaves anyway. Before the
// denial round, every rank, the victim included, stopped at the forged
// request, and the cancelled request kept its maker training.
func TestForgedLeaveIsIgnored(t *testing.T) {
	const n = 3
	cfg := mlpCfg(12, []int{8}, 3, 2, 1)
	x, y := randomBatch(rand.New(rand.NewPCG(1, 2)), 2, 12, 3)
	for _, tc := range []struct {
		name   string
		add    float32 // what rank 2 adds to rank 0's slot
		cut    float32 // what rank 2 takes from the length of rank 0's answer
		asks   bool    // rank 0 asks to leave
		leaves [n][]int
		forged int
	}{
		{"a request in another's name", 1, 0, false, [n][]int{nil, nil, nil}, 1},
		{"a request in another's name, its denial tampered with", 1, 3, false, [n][]int{nil, nil, nil}, 1},
		{"a request in another's name, its denial cut out", 1, 100, false, [n][]int{nil, nil, nil}, 1},
		{"a real request", 0, 0, true, [n][]int{{0}, {0}, {0}}, 0},
		{"a real request cancelled on the way", -1, 0, true, [n][]int{{0}, nil, nil}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, n)
			reps := make([]*Replica, n)
			errs := make([]error, n)
			onAll(n, func(i int) error {
				reps[i] = NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, rings[i])
				if i == 2 {
					reps[i].Coll = leaveForger{rings[i], 0, tc.add, reps[i].nparams, tc.cut}
				}
				if i == 0 && tc.asks {
					leave := make(chan struct{})
					close(leave)
					reps[i].Leave = leave
				}
				_, errs[i] = reps[i].Step(context.Background(), x, y, 2)
				return nil
			})
			for i, err := range errs {
				var le *LeaveError
				var got []int
				if errors.As(err, &le) {
					got = le.Ranks
				} else if err != nil {
					t.Errorf("rank %d: Step = %v", i, err)
				}
				if !slices.Equal(got, tc.leaves[i]) {
					t.Errorf("rank %d: ranks leaving %v; want %v", i, got, tc.leaves[i])
				}
				if reps[i].Stats.ForgedLeaves != tc.forged {
					t.Errorf("rank %d: %d forged requests counted; want %d", i, reps[i].Stats.ForgedLeaves, tc.forged)
				}
				if !slices.Equal(reps[i].Model.Params()[0], reps[0].Model.Params()[0]) {
					t.Errorf("rank %d: parameters differ from rank 0's after the step", i)
				}
			}
		})
	}
}

// bigGradients is a rank that multiplies its gradients by by in the step's
// allreduce — and, if honest, the norm it declared with them.
type bigGradients struct {
	Collective
	by      float32
	honest  bool
	nparams int
}

func (b bigGradients) AllreduceMean(ctx context.Context, buf []float32) error {
	if len(buf) == b.nparams+stepTrailer(b.Size(), true) {
		for i := range b.nparams {
			buf[i] *= b.by
		}
		if b.honest {
			buf[b.nparams+stepFlags+b.Size()+b.Rank()] *= b.by
		}
	}
	return b.Collective.AllreduceMean(ctx, buf)
}

// TestNormGuard: with the guard on, a rank whose gradients are 1000 times
// the others' gets the step skipped on every rank and is named, whether
// it declares its norm honestly (over the factor times the median) or
// declares the small one it would have had (the average is then longer
// than the declared norms allow). Without the guard the same gradients
// are applied on every rank; with it and honest ranks, steps are applied.
func TestNormGuard(t *testing.T) {
	const n = 3
	cfg := mlpCfg(12, []int{8}, 3, 2, 1)
	x, y := randomBatch(rand.New(rand.NewPCG(1, 2)), 2, 12, 3)
	for _, tc := range []struct {
		name    string
		guard   float64
		by      float32
		honest  bool
		skipped bool
		names   string // in the error
	}{
		{"honest ranks", 10, 1, true, false, ""},
		{"a huge rank, declared", 10, 1000, true, true, "rank(s) [1]"},
		{"a huge rank, declared small", 10, 1000, false, true, "a rank declared less than it sent"},
		{"a huge rank, no guard", 0, 1000, true, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, n)
			errs := make([]error, n)
			changed := make([]bool, n)
			params := make([][]float32, n)
			onAll(n, func(i int) error {
				rep := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, rings[i])
				rep.NormGuard = tc.guard
				if i == 1 {
					rep.Coll = bigGradients{rings[i], tc.by, tc.honest, rep.nparams}
				}
				before := slices.Clone(rep.Model.Params()[0])
				_, errs[i] = rep.Step(context.Background(), x, y, 2)
				params[i] = slices.Clone(rep.Model.Params()[0])
				changed[i] = !slices.Equal(before, params[i])
				if tc.skipped && rep.Stats.Skipped != 1 {
					t.Errorf("rank %d: %d steps counted skipped; want 1", i, rep.Stats.Skipped)
				}
				return nil
			})
			for i, err := range errs {
				if tc.skipped {
					if !errors.Is(err, ErrGradientNorm) || !Skipped(err) || !strings.Contains(err.Error(), tc.names) {
						t.Errorf("rank %d: Step = %v; want ErrGradientNorm naming %q", i, err, tc.names)
					}
				} else if err != nil {
					t.Errorf("rank %d: Step = %v", i, err)
				}
				if changed[i] == tc.skipped {
					t.Errorf("rank %d: parameters changed %t; want %t", i, changed[i], !tc.skipped)
				}
				if !slices.Equal(params[i], params[0]) {
					t.Errorf("rank %d: parameters differ from rank 0's", i)
				}
			}
		})
	}
}

// TestNarrowWire: with bf16 gradients on the wire, every rank applies the
// same bits, the parameters stay within bf16's error of the float32 run's,
// half the gradient bytes are counted, and a collective that cannot send
// bf16 is an error before anything is computed.
func TestNarrowWire(t *testing.T) {
	const n = 3
	// Wide enough that the gradients outweigh the frame headers, which
	// the measured byte count includes (with 8 hidden units bf16 saved 13%).
	cfg := mlpCfg(12, []int{256}, 3, 2, 1)
	x, y := randomBatch(rand.New(rand.NewPCG(1, 2)), 2, 12, 3)
	params := map[ring.Encoding][][]float32{}
	sent := map[ring.Encoding]int64{}
	for _, wire := range []ring.Encoding{ring.F32, ring.BF16} {
		rings := memRings(t, n)
		params[wire] = make([][]float32, n)
		errs := onAll(n, func(i int) error {
			rep := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, rings[i])
			rep.Wire = wire
			for range 3 {
				if _, err := rep.Step(context.Background(), x, y, 2); err != nil {
					return err
				}
			}
			params[wire][i] = slices.Clone(rep.Model.Params()[0])
			if i == 0 {
				sent[wire] = rep.Stats.BytesSent
			}
			return nil
		})
		if errs != nil {
			t.Fatalf("%v: %v", wire, errs)
		}
		for i := 1; i < n; i++ {
			if !slices.Equal(params[wire][i], params[wire][0]) {
				t.Errorf("%v: rank %d's parameters differ from rank 0's", wire, i)
			}
		}
	}
	for j, want := range params[ring.F32][0] {
		if got := params[ring.BF16][0][j]; math.Abs(float64(got-want)) > 3*0.1*math.Abs(float64(want))/256+1e-3 {
			t.Fatalf("parameter %d: %v with bf16, %v with float32", j, got, want)
		}
	}
	if r := float64(sent[ring.BF16]) / float64(sent[ring.F32]); r > 0.6 {
		t.Errorf("bf16 counted %d bytes, float32 %d (%.2f); want about half", sent[ring.BF16], sent[ring.F32], r)
	}
	rep := NewReplica(newMLP(t, cfg), &SGD{LR: 0.1}, hidingNaN{memRings(t, 1)[0]})
	rep.Wire = ring.BF16
	if _, err := rep.Step(context.Background(), x, y, 2); err == nil || !strings.Contains(err.Error(), "float32 only") {
		t.Errorf("bf16 over a float32-only collective: %v; want an error saying so", err)
	}
}

// TestLevelAcrossAnEpochEnd: a peer lost in the allreduces that score an
// epoch's end leaves the ranks that finished them in the next epoch and
// the others, at the same step, before its end; or lost in the epoch's
// last step, one rank past the end and another a step behind. Every rank
// must take the position past the end (they failed with "a replica is in
// epoch 4, this one in 3", and the job ended). A claim of an epoch further
// on names its maker.
func TestLevelAcrossAnEpochEnd(t *testing.T) {
	const n = 3
	end := Position{Epochs: 2, Steps: 30, Skip: 96}    // the epoch's steps done, its end not
	next := Position{Epochs: 3, Steps: 30}             // past the end
	behind := Position{Epochs: 2, Steps: 29, Skip: 64} // the epoch's last step not applied
	for _, tc := range []struct {
		name string
		at   [n]Position
		want Position
		liar int // -1: none
	}{
		{"two before the end, one past it", [n]Position{end, end, next}, next, -1},
		{"one past it first", [n]Position{next, end, end}, next, -1},
		{"a step behind, across the end", [n]Position{behind, next, end}, next, -1},
		{"all before the end", [n]Position{end, end, end}, end, -1},
		{"one claims two epochs on", [n]Position{end, end, {Epochs: 4, Steps: 30}}, Position{}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rings := memRings(t, n)
			got, errs := make([]Position, n), make([]error, n)
			onAll(n, func(i int) error {
				rep := NewReplica(newMLP(t, mlpCfg(4, []int{3}, 2, 2, 1)), &SGD{LR: 0.1}, rings[i])
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				got[i], errs[i] = rep.Level(ctx, tc.at[i], true)
				return nil
			})
			for i := range n {
				var liar *LiarError
				switch {
				case tc.liar < 0 && (errs[i] != nil || got[i] != tc.want):
					t.Errorf("rank %d at %+v: Level = %+v, %v; want %+v", i, tc.at[i], got[i], errs[i], tc.want)
				case tc.liar >= 0 && tc.at[i].Epochs+1 < tc.at[tc.liar].Epochs &&
					(!errors.As(errs[i], &liar) || !slices.Equal(liar.Ranks, []int{tc.liar})):
					t.Errorf("rank %d: Level = %v; want rank %d named", i, errs[i], tc.liar)
				}
			}
		})
	}
}
