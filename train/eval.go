package train

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ringtrain/ringtrain/data"
)

// Result is what an evaluation found.
type Result struct {
	Loss     float64   // mean loss over the samples
	Accuracy float64   // share of samples whose largest logit is their label (see tallyTargets for MSE's and BCE's)
	PerClass []float64 // accuracy within each class (NaN where a class has no samples)
	Samples  int
}

// Evaluate scores the model on every batch of an epoch, forward only, in
// evaluation mode.
func Evaluate(m Model, e *data.Epoch, classes int) (Result, error) {
	t, err := tallyEpoch(m, e, classes)
	if err != nil {
		return Result{}, err
	}
	return t.result()
}

// EvaluateSharded scores the model on this rank's share of a data set (a
// loader with Sampler.Exact) and sums the counts over the collective, so
// every rank returns the result for the whole set, having scored 1/size of
// it. Every rank must call it, even one whose share is empty.
func EvaluateSharded(ctx context.Context, c Collective, m Model, e *data.Epoch, classes int) (Result, error) {
	t, err := tallyEpoch(m, e, classes)
	if err != nil {
		return Result{}, err
	}
	// Counts stay exact in float32 up to 2^24 samples; the loss sum is
	// rounded to float32 once, on the way in.
	classes = len(t.total)
	buf := make([]float32, 1+2*classes)
	buf[0] = float32(t.lossSum)
	for k := range classes {
		buf[1+k], buf[1+classes+k] = float32(t.correct[k]), float32(t.total[k])
	}
	if err := c.AllreduceSum(ctx, buf); err != nil {
		return Result{}, fmt.Errorf("%w: summing evaluation counts: %w", ErrCollective, err)
	}
	t.lossSum = float64(buf[0])
	for k := range classes {
		t.correct[k], t.total[k] = int(buf[1+k]), int(buf[1+classes+k])
	}
	return t.result()
}

// tally is an evaluation's counts before they become a Result.
type tally struct {
	lossSum        float64
	correct, total []int // per class
}

// Specced is a Model that says which spec it was built from; Evaluate
// asks it whether its outputs are class scores or compare with float
// targets.
type Specced interface {
	Spec() Spec
}

func tallyEpoch(m Model, e *data.Epoch, classes int) (tally, error) {
	t := tally{correct: make([]int, classes), total: make([]int, classes)}
	if sm, ok := m.(Specced); ok && sm.Spec().Targets() > 0 {
		return tallyTargets(m, sm.Spec(), e, classes)
	}
	err := e.Each(func(b *data.Batch) error {
		loss, err := m.Forward(b.X, b.Y, b.N)
		if err != nil {
			return err
		}
		t.lossSum += float64(loss) * float64(len(b.Y)) // a mean over every label: a language model's, every position
		logits := m.Logits()
		for i, y := range b.Y {
			row := logits[i*classes : (i+1)*classes]
			best := 0
			for k, v := range row {
				if v > row[best] {
					best = k
				}
			}
			if y < 0 || y >= classes {
				return fmt.Errorf("train: label %d outside [0, %d)", y, classes)
			}
			t.total[y]++
			if best == y {
				t.correct[y]++
			}
		}
		return nil
	})
	return t, err
}

// tallyTargets is tallyEpoch for a model with float targets, whose counts
// are all in class 0: every sample, and, for BCE, those whose every output
// is on its target's side of one half. MSE has no such count: its
// accuracy is 0.
func tallyTargets(m Model, spec Spec, e *data.Epoch, classes int) (tally, error) {
	t := tally{correct: make([]int, max(classes, 1)), total: make([]int, max(classes, 1))}
	k, w := spec.Targets(), spec.RowValues()
	err := e.Each(func(b *data.Batch) error {
		loss, err := m.Forward(b.X, b.Y, b.N)
		if err != nil {
			return err
		}
		t.lossSum += float64(loss) * float64(b.N)
		t.total[0] += b.N
		if spec.Loss != BCE {
			return nil
		}
		out := m.Logits()
		for r := range b.N {
			right := true
			for j, p := range out[r*k : (r+1)*k] {
				right = right && (p >= 0.5) == (b.X[(r+1)*w-k+j] >= 0.5)
			}
			if right {
				t.correct[0]++
			}
		}
		return nil
	})
	return t, err
}

func (t tally) result() (Result, error) {
	var r Result
	all := 0
	r.PerClass = make([]float64, len(t.total))
	for k := range t.total {
		r.Samples += t.total[k]
		all += t.correct[k]
		r.PerClass[k] = float64(t.correct[k]) / float64(t.total[k])
	}
	if r.Samples == 0 {
		return r, errors.New("train: nothing to evaluate")
	}
	r.Loss = t.lossSum / float64(r.Samples)
	r.Accuracy = float64(all) / float64(r.Samples)
	return r, nil
}

// validate scores the test set once the ranks hold the same parameters
// again after a multiple of EvalEvery steps — at the multiple itself with
// a sync every step, at the end of the round it falls in with LocalSGD —
// and reports it. A peer lost in it fails the step's aftermath as one
// lost in the in-sync check does.
func (e *epochRun) validate(ctx context.Context) error {
	cfg := e.cfg
	at := e.pos(e.step)
	if e.r.roundOpen() {
		return nil
	}
	passed := cfg.EvalEvery > 0 && at.Steps/cfg.EvalEvery > e.level/cfg.EvalEvery
	e.level = at.Steps
	if !passed || cfg.Test == nil || e.step >= e.steps {
		return nil
	}
	res, err := evaluate(ctx, cfg)
	if err != nil {
		return err
	}
	if cfg.Progress != nil {
		cfg.Progress(Progress{Epoch: e.at.Epochs, Step: e.step, Steps: e.steps, Validation: true, TestAccuracy: res.Accuracy, TestLoss: res.Loss,
			WorldSize: e.r.Coll.Size(), Stats: e.r.Stats})
	}
	return nil
}

// end is the epoch's end: the replicas compare hashes and score the test
// set, the checkpoint is written and progress reported. A peer lost here
// interrupts the run at the epoch's last position, so that the end runs
// again in the changed ring.
func (e *epochRun) end(ctx context.Context, s *Summary) error {
	r, cfg := e.r, e.cfg
	at := e.pos(e.step)
	err := r.CheckInSync(ctx)
	var res Result
	if err == nil && cfg.Test != nil {
		res, err = evaluate(ctx, cfg)
	}
	if errors.Is(err, ErrCollective) || errors.Is(err, ErrLiar) {
		s.Position = at
		return &Interrupted{At: at, Cause: err}
	}
	if err != nil {
		return fmt.Errorf("train: after epoch %d: %w", at.Epochs+1, err)
	}
	if cfg.Test != nil {
		s.TestLoss, s.TestAccuracy, s.PerClass, s.TestSamples = res.Loss, res.Accuracy, res.PerClass, res.Samples
		s.EpochAccuracy = append(s.EpochAccuracy, res.Accuracy)
	}
	if cfg.Save != nil {
		if err := cfg.Save(Position{Epochs: at.Epochs + 1, Steps: at.Steps}); err != nil {
			return err
		}
	}
	if cfg.Progress != nil {
		elapsed := time.Since(e.start)
		p := Progress{Epoch: at.Epochs, Step: e.step, Steps: e.steps, SamplesPerSec: float64(e.samples) / elapsed.Seconds(), Elapsed: elapsed,
			EpochDone: true, WorldSize: r.Coll.Size(), Stats: r.Stats, RankCompute: r.RankCompute(), Stragglers: r.Stragglers()}
		if e.lossN > 0 {
			p.Loss = e.lossSum / float64(e.lossN)
		}
		p.TestAccuracy, p.TestLoss = s.TestAccuracy, s.TestLoss
		cfg.Progress(p)
	}
	return nil
}

func evaluate(ctx context.Context, cfg RunConfig) (Result, error) {
	test := *cfg.Test
	test.Sampler.World, test.Sampler.Rank = cfg.Replica.Coll.Size(), cfg.Replica.Coll.Rank()
	e, err := test.Epoch(ctx, 0)
	if err != nil {
		return Result{}, err
	}
	defer e.Close()
	res, err := EvaluateSharded(ctx, cfg.Replica.Coll, cfg.Replica.Model, e, cfg.Classes)
	if err != nil {
		return res, fmt.Errorf("train: evaluating: %w", err)
	}
	return res, nil
}
