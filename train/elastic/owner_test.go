package elastic

import (
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
)

// killer is a model whose peer is killed in its n-th forward pass — or,
// with brk, whose ring breaks in that pass and every one after.
type killer struct {
	train.Model
	n         int
	kill, brk func()
}

func (k *killer) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	switch k.n--; {
	case k.n == 0 && k.kill != nil:
		k.kill()
		return 0, errKilled
	case k.n <= 0 && k.brk != nil:
		k.brk()
	}
	return k.Model.ForwardBackward(x, y, n)
}

// peerPlan is what happens to one peer in an owner test.
type peerPlan struct {
	killAtStep    int  // killed in this forward pass (counted from 1)
	breakFrom     int  // breaks its ring in this forward pass and every one after
	leaveAtStep   int  // Ctrl-C'd after this step
	arriveAt      int  // a newcomer, started once peer 0 has run this many steps
	stall         bool // a newcomer that stalls once admitted
	arriveOnGrow  bool // a newcomer, started as the ring first grows
	killAfterStep int  // killed once this step is done (and its checkpoint written)
	driftAfter    int  // its parameters drift after this forward pass: a replica the others' hash check names
}

// errNamedLiar stands, in a test's expectations, for the train.LiarError
// a peer the others named ends with.
var errNamedLiar = errors.New("named a liar")

// drifter is a model whose parameters drift from the others' after n
// forward passes, as a dishonest or broken replica's would.
type drifter struct {
	train.Model
	n int
}

func (d *drifter) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	if d.n--; d.n == 0 {
		d.Model.Params()[0][0] += 0.5
	}
	return d.Model.ForwardBackward(x, y, n)
}

// accounting counts, per epoch, how often each sample was trained.
type accounting struct {
	mu   sync.Mutex
	seen []map[int]int
}

func (a *accounting) trained(epoch int, index []int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.seen) <= epoch {
		a.seen = append(a.seen, map[int]int{})
	}
	for _, k := range index {
		a.seen[epoch][k]++
	}
}

// check says what is wrong with the counts: a sample of an epoch never
// trained, or trained more than once.
func (a *accounting) check(epochs, n int) error {
	if len(a.seen) != epochs {
		return fmt.Errorf("%d epochs trained; want %d", len(a.seen), epochs)
	}
	for e, got := range a.seen {
		for k := range n {
			if c := got[k]; c != 1 {
				return fmt.Errorf("epoch %d: sample %d trained %d times", e+1, k, c)
			}
		}
		if len(got) != n {
			return fmt.Errorf("epoch %d: indices outside the dataset trained", e+1)
		}
	}
	return nil
}

// ownerRun runs the peers of plans (the first world of them forming the
// first ring) as Jobs over one world, two epochs of the test subset, and
// returns their summaries, errors, the log and the sample accounting.
func ownerRun(t *testing.T, world0, minWorld, maxWorld int, plans []peerPlan, setup func(*world, []string, []context.CancelFunc)) ([]train.Summary, []error, string, *accounting) {
	t.Helper()
	return ownerRunOf(t, mlpJob(t), world0, minWorld, maxWorld, plans, setup)
}

// mlpJob is an mlp of batch 16 with SGD on the test subset of
// Fashion-MNIST (2,000 samples).
func mlpJob(t *testing.T) ownerJob {
	cfg, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	split, err := cfg.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	return ownerJob{split: split, classes: 10, model: func(seed uint64) train.ModelConfig {
		return train.ModelConfig{Spec: train.MLPSpec(784, []int{16}, 10), Batch: 16, Seed: seed}
	}, opt: func([]string) train.Optimizer { return &train.SGD{LR: 0.05, Momentum: 0.9} }}
}

// gptJob is a byte-level GPT (1 block, dim 16, 2 heads, context 16) of
// batch 8 with AdamW on 2,000 windows of text.
func gptJob(t *testing.T) ownerJob {
	const T = 16
	corpus := strings.Repeat("It was the best of times, it was the worst of times. ", 2000*(T+1)/53+2)
	split := &data.Split{Dataset: &data.Dataset{Source: "test corpus"}, Pipeline: &data.Pipeline{}, C: 1, H: 1,
		Text: &data.Text{Source: "test corpus", Bytes: []byte(corpus)}}
	if err := split.SetContext(T); err != nil {
		t.Fatal(err)
	}
	return ownerJob{split: split, classes: train.DefaultVocab, model: func(seed uint64) train.ModelConfig {
		return train.ModelConfig{Spec: train.GPTSpec(1, 16, 2, T), Batch: 8, Seed: seed}
	}, opt: func(names []string) train.Optimizer { return train.NewAdamW(3e-3, 0.1, train.DecayWeights(names)) }}
}

// ownerJob is what the owner's peers train: the split, its classes, the
// model of a seed and the optimizer for its tensors.
type ownerJob struct {
	split   *data.Split
	classes int
	model   func(seed uint64) train.ModelConfig
	opt     func(names []string) train.Optimizer
}

// ownerRunOf is ownerRun training job.
func ownerRunOf(t *testing.T, job ownerJob, world0, minWorld, maxWorld int, plans []peerPlan, setup func(*world, []string, []context.CancelFunc)) ([]train.Summary, []error, string, *accounting) {
	t.Helper()
	names := make([]string, len(plans))
	for i := range names {
		names[i] = fmt.Sprintf("peer-%d", i)
	}
	w := newWorld(t, names[:world0])
	split := job.split
	var log lockedBuffer
	acct := &accounting{}
	sums := make([]train.Summary, len(plans))
	errs := make([]error, len(plans))
	ctxs := make([]context.Context, len(plans))
	cancels := make([]context.CancelFunc, len(plans))
	for i := range plans {
		ctxs[i], cancels[i] = context.WithCancel(context.Background())
		t.Cleanup(cancels[i])
	}
	if setup != nil {
		setup(w, names, cancels)
	}
	// With a newcomer that stalls, the step timeout is far longer than the
	// test's patience: only the admission's own bound can drop it.
	stepTimeout := 10 * time.Second
	if slices.ContainsFunc(plans, func(p peerPlan) bool { return p.stall }) {
		stepTimeout = 10 * time.Minute
	}
	progress := make(chan int, 1024) // peer 0's steps, for newcomers to start by
	var wg, stallers sync.WaitGroup
	for i, p := range plans {
		spec := job.model(uint64(i + 1))
		m, err := train.NewModel(spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		var model train.Model = m
		switch {
		case p.killAtStep > 0:
			model = &killer{Model: m, n: p.killAtStep, kill: func() { w.kill(names[i]) }}
		case p.breakFrom > 0:
			model = &killer{Model: m, n: p.breakFrom, brk: func() { w.breakRing(names[i]) }}
		case p.driftAfter > 0:
			model = &drifter{Model: m, n: p.driftAfter}
		}
		if p.stall {
			w.stallOnAdmit[names[i]] = true
		}
		ej := &Job{Members: &member{w: w, name: names[i]}, WorldSize: world0, MinWorldSize: minWorld, MaxWorldSize: maxWorld,
			StepTimeout: stepTimeout, AdmitTimeout: time.Second, Logger: zerolog.New(&log).With().Str("peer", names[i]).Logger(),
			Dropped: func(peers []string, _ string) { w.drop(peers) }}
		saveEvery := 0
		if w.checkpoints {
			ej.Checkpoint = filepath.Join(t.TempDir(), "job.ckpt")
			ej.CheckpointBase = train.Checkpoint{Model: spec, Seed: 1, Classes: split.Classes}
			saveEvery = 5
		}
		rep := train.NewReplica(model, job.opt(m.ParamNames()), nil)
		ej.Training = train.RunConfig{Replica: rep, Epochs: 2, Classes: job.classes, Trained: acct.trained, ProgressEvery: 1, SaveEvery: saveEvery,
			Train: &data.Loader{Split: split, BatchSize: spec.Batch, Seed: 1, Sampler: data.Sampler{N: split.Len(), World: 1, Seed: 1, Shuffle: true}}}
		ej.Training.Progress = func(pr train.Progress) {
			if i == 0 && !pr.EpochDone {
				select {
				case progress <- pr.Stats.Steps:
				default:
				}
			}
			if p.leaveAtStep > 0 && pr.Stats.Steps >= p.leaveAtStep {
				cancels[i]()
			}
			if p.killAfterStep > 0 && pr.Stats.Steps == p.killAfterStep {
				w.kill(names[i])
			}
		}
		g := &wg
		if p.stall {
			g = &stallers
		}
		g.Go(func() {
			if p.arriveOnGrow {
				<-w.growing
			}
			if p.arriveAt > 0 {
				for s := range progress {
					if s >= p.arriveAt {
						break
					}
				}
			}
			sums[i], errs[i] = ej.Run(ctxs[i])
		})
	}
	wg.Wait()
	close(w.done) // the stalled peers are killed
	stallers.Wait()
	return sums, errs, log.String(), acct
}

// TestOwnerTransitions drives every transition of the owner from a table:
// a peer lost during a step, during a re-formation and during an
// admission; a leave during a step and during a re-formation; a newcomer
// during a step and during a re-formation. In each, the peers that stay
// finish with the same parameters, the others end as they should, and
// every sample of both epochs is trained exactly once across the world.
func TestOwnerTransitions(t *testing.T) {
	for _, tc := range []struct {
		name         string
		world0, min  int
		max          int
		plans        []peerPlan
		setup        func(*world, []string, []context.CancelFunc)
		ended        map[int]error // peers whose part ends early, and how
		wantLog      []string
		wantFinalLen int // the ring's size at the end
	}{
		{name: "lost during a step", world0: 3, min: 2, plans: []peerPlan{{}, {}, {killAtStep: 7}},
			ended: map[int]error{2: errKilled}, wantLog: []string{"ring re-formed without the lost peers"}, wantFinalLen: 2},
		{name: "lost during a re-formation", world0: 4, min: 2, plans: []peerPlan{{}, {}, {killAtStep: 7}, {}},
			setup: func(w *world, n []string, _ []context.CancelFunc) { w.killOnReform[n[3]] = true },
			ended: map[int]error{2: errKilled, 3: errKilled}, wantFinalLen: 2},
		{name: "leave during a step", world0: 3, min: 2, plans: []peerPlan{{}, {leaveAtStep: 5}, {}},
			ended: map[int]error{1: ErrLeft}, wantLog: []string{"ring re-formed without the peers that left; carrying on"}, wantFinalLen: 2},
		{name: "leave during a re-formation", world0: 4, min: 2, plans: []peerPlan{{}, {}, {killAtStep: 7}, {}},
			setup: func(w *world, n []string, c []context.CancelFunc) { w.leaveOnReform[n[1]] = c[1] },
			ended: map[int]error{1: ErrLeft, 2: errKilled}, wantFinalLen: 2},
		{name: "newcomer during a step", world0: 2, min: 2, max: 3, plans: []peerPlan{{}, {}, {arriveAt: 10}},
			wantLog: []string{"ring grew: admitted newcomers", "admitted to the ring"}, wantFinalLen: 3},
		{name: "newcomer during a re-formation", world0: 3, min: 2, max: 3, plans: []peerPlan{{}, {}, {killAtStep: 7}, {arriveAt: 6}},
			ended: map[int]error{2: errKilled}, wantLog: []string{"ring grew: admitted newcomers"}, wantFinalLen: 3},
		{name: "lost during an admission", world0: 2, min: 2, max: 3, plans: []peerPlan{{}, {}, {arriveAt: 10}},
			setup: func(w *world, n []string, _ []context.CancelFunc) { w.killOnAdmit[n[2]] = true },
			ended: map[int]error{2: errKilled}, wantFinalLen: 2},
		{name: "lost during a checkpoint write", world0: 3, min: 2, plans: []peerPlan{{}, {}, {killAfterStep: 10}},
			setup: func(w *world, _ []string, _ []context.CancelFunc) { w.checkpoints = true },
			ended: map[int]error{2: errKilled}, wantLog: []string{"checkpoint written", "ring re-formed without the lost peers"}, wantFinalLen: 2},
		{name: "leave during a checkpoint write", world0: 3, min: 2, plans: []peerPlan{{}, {leaveAtStep: 10}, {}},
			setup: func(w *world, _ []string, _ []context.CancelFunc) { w.checkpoints = true },
			ended: map[int]error{1: ErrLeft}, wantLog: []string{"ring re-formed without the peers that left"}, wantFinalLen: 2},
		{name: "newcomer during a checkpoint write", world0: 2, min: 2, max: 3, plans: []peerPlan{{}, {}, {arriveAt: 10}},
			setup:   func(w *world, _ []string, _ []context.CancelFunc) { w.checkpoints = true },
			wantLog: []string{"checkpoint written", "ring grew: admitted newcomers"}, wantFinalLen: 3},
		{name: "leave during an admission", world0: 3, min: 2, max: 4, plans: []peerPlan{{}, {}, {}, {arriveAt: 10}},
			setup: func(w *world, n []string, c []context.CancelFunc) { w.leaveOnGrow[n[1]] = c[1] },
			ended: map[int]error{1: ErrLeft}, wantLog: []string{"ring grew: admitted newcomers", "ring re-formed without the peers that left"}, wantFinalLen: 3},
		{name: "newcomer during an admission", world0: 2, min: 2, max: 4, plans: []peerPlan{{}, {}, {arriveAt: 10}, {arriveOnGrow: true}},
			wantLog: []string{"ring grew: admitted newcomers"}, wantFinalLen: 4},
		{name: "stalled during an admission", world0: 2, min: 2, max: 3, plans: []peerPlan{{}, {}, {arriveAt: 10, stall: true}},
			ended: map[int]error{2: errKilled}, wantLog: []string{"ring re-formed without the lost peers"}, wantFinalLen: 2},
		{name: "a replica drifts: named at the hash check and dropped", world0: 3, min: 2, plans: []peerPlan{{}, {}, {driftAfter: 5}},
			setup: func(w *world, n []string, _ []context.CancelFunc) {
				t.Cleanup(func() {
					w.mu.Lock()
					defer w.mu.Unlock()
					if len(w.dropped) != 2 || w.dropped[0] != n[2] || w.dropped[1] != n[2] {
						t.Errorf("Dropped heard %v; want %s from each of the other two", w.dropped, n[2])
					}
					if len(w.distrusted) != 2 || w.distrusted[0] != n[2] || w.distrusted[1] != n[2] {
						t.Errorf("memberships told to keep out %v; want %s by each of the other two", w.distrusted, n[2])
					}
				})
			},
			ended: map[int]error{2: errNamedLiar}, wantLog: []string{"what no honest replica could"}, wantFinalLen: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			began := time.Now()
			sums, errs, log, acct := ownerRun(t, tc.world0, tc.min, tc.max, tc.plans, tc.setup)
			if took := time.Since(began); took > 2*time.Minute {
				t.Errorf("took %v: the ring waited for a peer it should have dropped", took)
			}
			var hash string
			stayed := 0
			for i, err := range errs {
				if want, ok := tc.ended[i]; ok {
					var liar *train.LiarError
					if want == errNamedLiar && !errors.As(err, &liar) || want != errNamedLiar && !errors.Is(err, want) {
						t.Errorf("peer %d: %v; want %v", i, err, want)
					}
					continue
				}
				if err != nil {
					t.Fatalf("peer %d: %v\n%s", i, err, log)
				}
				if hash == "" {
					hash = sums[i].ParamHash
				}
				if sums[i].ParamHash != hash || sums[i].Epochs != 2 {
					t.Errorf("peer %d ends at epoch %d with %.16s; want 2 and %.16s", i, sums[i].Epochs, sums[i].ParamHash, hash)
				}
				stayed++
			}
			if stayed != tc.wantFinalLen {
				t.Errorf("%d peers finished; want %d", stayed, tc.wantFinalLen)
			}
			for _, s := range tc.wantLog {
				if !strings.Contains(log, s) {
					t.Errorf("the log lacks %q:\n%s", s, log)
				}
			}
			if strings.Contains(log, "lost") && tc.name == "leave during a step" {
				t.Errorf("a leave was logged as a loss:\n%s", log)
			}
			if err := acct.check(2, 2000); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestOwnerAccountingThroughThreeEvents: a newcomer, a leave and a loss in
// one run of two epochs, of the mlp and of a GPT on text; every sample of
// each epoch is trained exactly once across the world, the three peers
// left end alike, and those three, not the others, tell the standbys the
// job has ended.
func TestOwnerAccountingThroughThreeEvents(t *testing.T) {
	for _, tc := range []struct {
		name string
		job  func(*testing.T) ownerJob
	}{{"mlp", mlpJob}, {"gpt", gptJob}} {
		t.Run(tc.name, func(t *testing.T) {
			job := tc.job(t)
			plans := []peerPlan{{}, {leaveAtStep: 20}, {}, {killAtStep: 40}, {arriveAt: 10}}
			var w *world
			sums, errs, log, acct := ownerRunOf(t, job, 4, 2, 5, plans, func(world *world, _ []string, _ []context.CancelFunc) { w = world })
			if !errors.Is(errs[1], ErrLeft) || !errors.Is(errs[3], errKilled) {
				t.Errorf("the leaver: %v; the killed: %v", errs[1], errs[3])
			}
			for _, i := range []int{0, 2, 4} {
				if errs[i] != nil || sums[i].ParamHash != sums[0].ParamHash {
					t.Fatalf("peer %d: %v, %.16s; want rank 0's %.16s\n%s", i, errs[i], sums[i].ParamHash, sums[0].ParamHash, log)
				}
			}
			for _, s := range []string{"ring grew: admitted newcomers", "ring re-formed without the peers that left", "ring re-formed without the lost peers"} {
				if !strings.Contains(log, s) {
					t.Errorf("the log lacks %q", s)
				}
			}
			if err := acct.check(2, job.split.Len()); err != nil {
				t.Error(err)
			}
			w.mu.Lock()
			ended := slices.Sorted(slices.Values(w.ended))
			w.mu.Unlock()
			if want := []string{"peer-0", "peer-2", "peer-4"}; !slices.Equal(ended, want) {
				t.Errorf("%v told the standbys the job had ended; want those that finished, %v", ended, want)
			}
		})
	}
}

// TestOwnerReformBudget: a peer that breaks every ring it is in (it
// stays alive, so it is in every ring) stops the job after MaxReforms
// re-formations in a row with ErrReformBudget, rather than re-forming for
// ever.
func TestOwnerReformBudget(t *testing.T) {
	_, errs, log, _ := ownerRun(t, 3, 2, 0, []peerPlan{{}, {}, {breakFrom: 5}}, nil)
	for i, err := range errs {
		if !errors.Is(err, ErrReformBudget) {
			t.Errorf("peer %d: %v; want ErrReformBudget\n%s", i, err, log)
		}
	}
}

// TestClassify: what the owner makes of each way training ends, for the
// peer at rank 1 of a ring of 4 with a minimum of 3.
func TestClassify(t *testing.T) {
	lostStep := &train.Interrupted{Cause: fmt.Errorf("%w: averaging gradients: %w", train.ErrCollective, errKilled)}
	for _, tc := range []struct {
		name  string
		err   error
		want  event
		ranks []int
	}{
		{"the run ended", nil, finished, nil},
		{"a peer lost in a step", lostStep, lost, nil},
		{"a peer lost while levelling", fmt.Errorf("%w: comparing states: %w", train.ErrCollective, errKilled), lost, nil},
		{"another leaves, enough stay", &train.Interrupted{Cause: &train.LeaveError{Ranks: []int{2}}}, left, []int{2}},
		{"this one leaves, enough stay", &train.Interrupted{Cause: &train.LeaveError{Ranks: []int{1}}}, leaving, []int{1}},
		{"two leave, too few stay", &train.Interrupted{Cause: &train.LeaveError{Ranks: []int{1, 2}}}, stopped, []int{1, 2}},
		{"a leave with a skipped step", &train.Interrupted{Cause: errors.Join(train.ErrNonFinite, &train.LeaveError{Ranks: []int{3}})}, left, []int{3}},
		{"another lies", &train.LiarError{Ranks: []int{0}}, liars, []int{0}},
		{"this one is named a liar", &train.LiarError{Ranks: []int{1}}, failed, []int{1}},
		{"too many liars to carry on", &train.LiarError{Ranks: []int{0, 2}}, failed, []int{0, 2}},
		{"a newcomer waits", &train.Interrupted{Cause: train.ErrNewcomer}, newcomer, nil},
		{"a model error", errors.New("engine: out of memory"), failed, nil},
	} {
		ev, ranks := classify(tc.err, 1, 4, 3)
		if ev != tc.want || !slices.Equal(ranks, tc.ranks) {
			t.Errorf("%s: %v %v; want %v %v", tc.name, ev, ranks, tc.want, tc.ranks)
		}
	}
}
