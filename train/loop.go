package train

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/data"
)

// RunConfig describes a training run of one replica.
type RunConfig struct {
	Replica *Replica
	Train   *data.Loader // this rank's share of each epoch
	// Test is this rank's share of the test set (Sampler.Exact), scored
	// after every epoch; every rank gets the whole set's result. Nil on
	// every rank skips evaluation.
	Test    *data.Loader
	Epochs  int
	Classes int
	// Schedule, if set, gives the learning rate of every epoch.
	Schedule *Schedule
	// Start is where to begin: a checkpoint's position when resuming, the
	// position the replicas agreed on after an interruption, the zero
	// Position otherwise. The positions of Start's epoch not yet trained
	// are shared out among the ranks of the current ring.
	Start Position
	// InSync says the replicas already hold the same state (admitted,
	// resumed, or brought level after an interruption): Run does not
	// broadcast rank 0's parameters first.
	InSync bool
	// Save, if set, is called after every epoch once the replicas are
	// known to agree, and every SaveEvery steps (if not 0) in between —
	// the place to write a checkpoint.
	Save      func(Position) error
	SaveEvery int
	// EvalEvery, if above 0 with a Test set, scores it every EvalEvery
	// steps too, not only at every epoch's end — where the ranks hold the
	// same parameters: a multiple that falls inside a LocalSGD round is
	// scored at the round's end — and reports it as a Progress with
	// Validation set. Every rank must hold the same value:
	// the scoring is a collective.
	EvalEvery int
	// MaxSkips is how many steps in a row may be skipped for non-finite
	// gradients before the run stops. Zero means 5.
	MaxSkips int
	// Stop, if set and closed, ends the run on every rank after one more
	// step, which carries the request to the others (Replica.Leave): Run
	// returns an *Interrupted whose Cause is a *LeaveError naming the ranks
	// that asked (an ErrStopped), and Summary.Position says where to
	// resume — the same on every rank.
	Stop <-chan struct{}
	// Progress, if set, is called every ProgressEvery steps and at the end
	// of every epoch.
	Progress      func(Progress)
	ProgressEvery int
	// OnSkip, if set, is told why each step every rank skipped together
	// was skipped (ErrNonFinite, ErrGradientNorm: which ranks, what
	// values).
	OnSkip func(error)
	// Trained, if set, is told the dataset indices of each batch this
	// rank trained on, once its step is done for good: applied or skipped
	// on every rank, and with LocalSGD once the round's outer step is.
	// Across interruptions every sample of an epoch is reported once by
	// exactly one rank: what accounting needs. index is reused after the
	// call.
	Trained func(epoch int, index []int)
	// Blocks, if set, is told on every rank each step's whole block — the
	// positions from, from+len(index) of the epoch's permutation, every
	// rank's batch — under the same rule as Trained. A peer killed after
	// its gradients went into a step the others applied never reports
	// its own batch; the others' Blocks hold it. index is not to be kept.
	Blocks func(epoch, from int, index []int)
}

// Progress is a report from the middle of a run.
type Progress struct {
	Epoch, Step, Steps int
	Loss               float64       // mean local loss since the last report
	SamplesPerSec      float64       // this rank's, since the epoch began
	Elapsed            time.Duration // since the epoch began
	EpochDone          bool
	// Validation is a score of the test set between epochs' ends
	// (RunConfig.EvalEvery): TestAccuracy and TestLoss are set, and the
	// training figures are not.
	Validation   bool
	TestAccuracy float64 // with EpochDone, if there is a test set
	TestLoss     float64 // with it, the mean loss over the test set (a language model's: per byte, in nats)
	WorldSize    int
	Stats        ReplicaStats // the replica's, summed since it was made
	// With EpochDone: every rank's compute seconds in the epoch, and the
	// ranks more than 20% slower than the median (Replica.Stragglers).
	RankCompute []float64
	Stragglers  []int
}

// Position is where a run is: Epochs completed, Steps run in all, and Skip,
// the positions of epoch Epochs's permutation already trained on (the
// samples of Skip/world steps of every rank, when stopped mid-epoch).
type Position struct {
	Epochs, Steps, Skip int
}

// ErrStopped is what Run returns when RunConfig.Stop ends it.
var ErrStopped = errors.New("train: stopped")

// ErrNewcomer means a newcomer waits to be admitted (Replica.Waiting): the
// step that said so was applied on every rank.
var ErrNewcomer = errors.New("train: a newcomer waits to be admitted")

// Interrupted is what Run returns when the ring must change before the run
// can go on. Cause wraps ErrCollective (a peer was lost or stalled: the
// step that failed was applied on no rank whose call failed, though it may
// have been on others), or is a *LeaveError (ranks asked to leave after a
// step every rank applied), a *LiarError (ranks caught lying) or
// ErrNewcomer. At is where this rank is: nothing after it was applied
// here. Run never changes its collective: the caller changes the ring,
// brings the replicas level (Replica.Level) and runs again from the
// position they agree on.
type Interrupted struct {
	At    Position
	Cause error
	// Unapplied is the step (or LocalSGD round) that failed here, if
	// RunConfig.Trained is set: ranks that had every frame before a peer
	// went may have applied it, with this rank's gradients in it.
	Unapplied *Unapplied
}

// Unapplied is the dataset indices of a step, or a LocalSGD round, that
// failed on this rank — its batches (Index) and whole blocks (Blocks) —
// and the step count it would have reached.
type Unapplied struct {
	Epoch  int
	End    int
	Index  [][]int
	Blocks []Block
}

// Block is a step's whole block: the positions From, From+len(Index) of
// its epoch's permutation, and their dataset indices.
type Block struct {
	From  int
	Index []int
}

// Report tells cfg's Trained and Blocks what u holds if the ring levelled
// at or past the step (at, from Replica.Level): the ranks that finished it
// applied it, this rank's gradients in it, and the others took their
// state. Otherwise the step runs again, and says so itself.
func (u *Unapplied) Report(at Position, cfg RunConfig) {
	if u != nil && at.Steps >= u.End {
		u.report(cfg)
	}
}

func (u *Unapplied) report(cfg RunConfig) {
	for i, ix := range u.Index {
		if cfg.Trained != nil {
			cfg.Trained(u.Epoch, ix)
		}
		if cfg.Blocks != nil {
			cfg.Blocks(u.Epoch, u.Blocks[i].From, u.Blocks[i].Index)
		}
	}
}

func (e *Interrupted) Error() string {
	return fmt.Sprintf("train: interrupted in epoch %d after %d steps: %v", e.At.Epochs+1, e.At.Steps, e.Cause)
}

func (e *Interrupted) Unwrap() error { return e.Cause }

// Summary is what a finished run reports.
type Summary struct {
	Position      // where the run ended or stopped
	TestLoss      float64
	TestAccuracy  float64
	PerClass      []float64
	TestSamples   int       // scored over all ranks
	EpochAccuracy []float64 // test accuracy after each epoch run
	ParamHash     string    // hex SHA-256 of the final parameters
	SamplesPerSec float64   // this rank's training samples per second
	// Trained and Busy are this rank's training samples and the time
	// its epochs took, for SamplesPerSec over several runs (Then).
	Trained int
	Busy    time.Duration
}

// Then is s followed by next, a run that carried on from where s was
// interrupted: next's position, hash and evaluation, both runs' epochs
// and throughput.
func (s Summary) Then(next Summary) Summary {
	out := next
	out.EpochAccuracy = append(append([]float64(nil), s.EpochAccuracy...), next.EpochAccuracy...)
	if next.TestSamples == 0 {
		out.TestLoss, out.TestAccuracy, out.PerClass, out.TestSamples = s.TestLoss, s.TestAccuracy, s.PerClass, s.TestSamples
	}
	out.Trained, out.Busy = s.Trained+next.Trained, s.Busy+next.Busy
	out.SamplesPerSec = 0
	if out.Busy > 0 {
		out.SamplesPerSec = float64(out.Trained) / out.Busy.Seconds()
	}
	return out
}

// Run starts every replica from rank 0's parameters (unless InSync),
// trains from Start to Epochs, checks at the end of each epoch that the
// replicas hold the same parameters, and evaluates. When the ring fails
// or must change it returns an *Interrupted with the Summary so far.
func Run(ctx context.Context, cfg RunConfig) (Summary, error) {
	if cfg.MaxSkips <= 0 {
		cfg.MaxSkips = 5
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 50
	}
	r := cfg.Replica
	r.Steps = cfg.Start.Steps
	if cfg.Stop != nil {
		r.Leave = cfg.Stop
	}
	var s Summary
	if !cfg.InSync {
		if err := r.SyncParams(ctx); err != nil {
			return s, err
		}
	}
	at, skips := cfg.Start, 0
	for ; at.Epochs < cfg.Epochs; at = (Position{Epochs: at.Epochs + 1, Steps: at.Steps}) {
		if cfg.Schedule != nil {
			r.Opt.SetLR(cfg.Schedule.LR(at.Epochs))
		}
		e := epochRun{cfg: cfg, r: r, at: at, start: time.Now(), skips: &skips, level: at.Steps}
		var err error
		if at, err = e.train(ctx); err != nil {
			s.Position = at
			return e.count(s), err
		}
		s = e.count(s)
		if err := e.end(ctx, &s); err != nil {
			return s, err
		}
	}
	s.Position = at
	if s.Busy > 0 {
		s.SamplesPerSec = float64(s.Trained) / s.Busy.Seconds()
	}
	h := r.ParamHash()
	s.ParamHash = hex.EncodeToString(h[:])
	return s, nil
}

// epochRun is one epoch of a Run, or what is left of it from at.
type epochRun struct {
	cfg        RunConfig
	r          *Replica
	at         Position // where the epoch part began
	start      time.Time
	fetched    time.Time // when the last step ended: the loader works from then
	step       int       // steps run in this part
	steps      int       // steps this part has in all
	block      int       // positions a full step trains: world × batch size
	left       int       // positions of the epoch this part has to train
	samples    int
	lossSum    float64
	lossN      int
	skips      *int    // steps skipped in a row, across epochs
	open       [][]int // indices of a LocalSGD round's steps, until it closes
	openBlocks []Block // the blocks of those steps
	// perm is the rest of the epoch's permutation from at, with
	// RunConfig.Blocks: step k's block is perm[k·block, (k+1)·block).
	perm []int
	// unapplied is the step or round that failed here, for Interrupted.
	unapplied *Unapplied
	// loader is this rank's loader of the part; peerIdx the other ranks'
	// shares of it, drawn when an audit first asks (peerBatch).
	loader  data.Loader
	peerIdx map[int][]int
	peerB   data.Batch
	level   int // the step count where the ranks last held the same parameters
}

// pos is the position after this part's first step steps.
func (e *epochRun) pos(step int) Position {
	take := e.r.Coll.Size() * e.cfg.Train.BatchSize
	return Position{Epochs: e.at.Epochs, Steps: e.at.Steps + step, Skip: min(e.at.Skip+step*take, e.cfg.Train.Sampler.N)}
}

// count adds the part's samples and time to s.
func (e *epochRun) count(s Summary) Summary {
	s.Trained += e.samples
	s.Busy += time.Since(e.start)
	return s
}

// train runs the epoch's steps from e.at, sharing the positions left among
// the ring's ranks. It returns the position it reached: the epoch's end,
// or, with an *Interrupted, where the ring must change.
func (e *epochRun) train(ctx context.Context) (Position, error) {
	tr := *e.cfg.Train
	tr.Sampler.World, tr.Sampler.Rank, tr.Sampler.Skip = e.r.Coll.Size(), e.r.Coll.Rank(), e.at.Skip
	// Every position left is trained once, by one rank: no padding. Step k
	// trains block k of the permutation — rank r the positions of it that
	// are r mod world — so at an epoch's uneven end the ranks' batches
	// differ (a rank may have none) and share weighs them (stepOn).
	tr.Sampler.Exact = !tr.Sampler.DropLast
	e.block = tr.Sampler.World * tr.BatchSize
	e.left = tr.Sampler.N - e.at.Skip
	e.steps = (e.left + e.block - 1) / e.block
	if tr.Sampler.DropLast {
		e.steps = tr.Batches()
	}
	if e.cfg.Blocks != nil {
		whole := tr.Sampler
		whole.World, whole.Rank, whole.Exact = 1, 0, true
		var err error
		if e.perm, err = whole.Indices(e.at.Epochs); err != nil {
			return e.at, err
		}
	}
	ep, err := tr.Epoch(ctx, e.at.Epochs)
	if err != nil {
		return e.at, err
	}
	e.loader = tr
	if sk := e.r.Sketch; sk != nil && sk.AuditEvery > 0 {
		e.r.peers = e.peerBatch
		defer func() { e.r.peers = nil }()
	}
	e.fetched = time.Now()
	e.r.part.steps, e.r.part.max = e.steps, e.steps
	defer func() { e.r.part.step, e.r.part.steps = 0, 0 }()
	err = ep.Each(func(b *data.Batch) error {
		r := e.r
		if r.Trace == nil {
			return e.stepOn(ctx, b)
		}
		// Between the last step's end and this one's start, the loader
		// was getting the batch.
		r.Trace.Span("data", e.fetched, time.Now(), r.Steps+1, -1)
		defer func() { e.fetched = time.Now() }()
		return e.stepOn(ctx, b)
	})
	ep.Close()
	for err == nil && e.step < e.steps {
		// This rank has no samples in the last block; it still takes part.
		err = e.stepOn(ctx, &data.Batch{})
	}
	if errors.Is(err, errEpochEnd) {
		// This rank was behind when the epoch's last outer round closed:
		// the rest of its share is not trained this epoch.
		err = nil
		e.step = e.steps
	}
	if err != nil {
		e.r.sync().abandon() // its goroutines are owned here; Level settles the round
	}
	var leave *LeaveError
	switch {
	case errors.As(err, &leave):
		// The stop came with the step that carried it: every rank applied
		// it. Summary.Position is where to resume after a stop; At is
		// where the others carry on from after a leave.
		at := e.pos(e.step)
		if e.step == e.steps {
			return Position{Epochs: at.Epochs + 1, Steps: at.Steps}, &Interrupted{At: at, Cause: err}
		}
		return at, &Interrupted{At: at, Cause: err}
	case errors.Is(err, ErrCollective), errors.Is(err, ErrLiar), errors.Is(err, ErrNewcomer):
		return e.pos(e.step), &Interrupted{At: e.pos(e.step), Cause: err, Unapplied: e.unapplied}
	case err != nil:
		return e.pos(e.step), err
	}
	return e.pos(e.step), nil
}

// stepOn runs one step of the epoch and what follows it: the in-sync
// check of a LocalSGD outer step, a checkpoint, a progress report, and the
// newcomer the step announced.
func (e *epochRun) stepOn(ctx context.Context, b *data.Batch) error {
	r, cfg := e.r, e.cfg
	e.prepare(b)
	loss, err := r.Step(ctx, b.X, b.Y, b.N)
	r.share = 0
	e.step++
	var leave *LeaveError
	if err == nil || Skipped(err) || errors.As(err, &leave) {
		e.trained(b.Index, e.step-1)
	}
	if lie := r.out.named; lie != nil && (err == nil || Skipped(err)) {
		e.samples += b.N // every rank names the same ranks after this step
		return lie
	}
	switch {
	case errors.As(err, &leave):
		return err // applied (or skipped) on every rank
	case Skipped(err):
		if cfg.OnSkip != nil {
			cfg.OnSkip(err)
		}
		if *e.skips++; *e.skips >= cfg.MaxSkips {
			return fmt.Errorf("train: %d steps in a row skipped, the last at epoch %d step %d: %w", *e.skips, e.at.Epochs+1, e.step, err)
		}
		if r.out.epochEnd && !r.out.newcomer {
			return errEpochEnd
		}
		return e.newcomer()
	case errors.Is(err, ErrCollective):
		if cfg.Trained != nil || cfg.Blocks != nil {
			// Not applied here; elsewhere it may have been (Unapplied).
			e.unapplied = &Unapplied{Epoch: e.at.Epochs, End: e.pos(e.step).Steps,
				Index: append(e.open, slices.Clone(b.Index)), Blocks: append(e.openBlocks, e.blockOf(e.step-1))}
		}
		e.step -= r.out.undone // not applied here: it runs again (a LocalSGD round, all of it)
		return err
	case err != nil:
		return fmt.Errorf("train: epoch %d step %d: %w", e.at.Epochs+1, e.step, err)
	}
	*e.skips = 0
	if r.out.epochEnd {
		e.samples += b.N
		return errEpochEnd
	}
	if r.InnerSkip != nil && cfg.OnSkip != nil {
		cfg.OnSkip(r.InnerSkip)
	}
	if r.out.outerDone && !r.out.outerChecked && e.step < e.steps {
		// Every outer step is checked, as every epoch is (a round with a
		// Deadline checks the one before it itself).
		if err := r.CheckInSync(ctx); err != nil {
			return err
		}
	}
	if at := e.pos(e.step); cfg.Save != nil && cfg.SaveEvery > 0 && at.Steps%cfg.SaveEvery == 0 && e.step < e.steps && !r.roundOpen() {
		if err := cfg.Save(at); err != nil {
			return err
		}
	}
	if err := e.validate(ctx); err != nil {
		return err
	}
	e.samples += b.N
	if b.N > 0 {
		e.lossSum += float64(loss)
		e.lossN++
	}
	if cfg.Progress != nil && e.step%cfg.ProgressEvery == 0 && e.lossN > 0 {
		el := time.Since(e.start)
		cfg.Progress(Progress{Epoch: e.at.Epochs, Step: e.step, Steps: e.steps, Loss: e.lossSum / float64(e.lossN),
			SamplesPerSec: float64(e.samples) / el.Seconds(), Elapsed: el, WorldSize: r.Coll.Size(), Stats: r.Stats})
		e.lossSum, e.lossN = 0, 0
	}
	return e.newcomer()
}

// prepare sets what the next step needs to know of its place: whether it
// is the epoch part's last (a LocalSGD round ends with the epoch), its
// learning rate, and this rank's share of its samples.
func (e *epochRun) prepare(b *data.Batch) {
	r := e.r
	r.part.closing = e.step+1 == e.steps
	r.part.step = e.step + 1
	if sch := e.cfg.Schedule; sch != nil && sch.PerStep() {
		r.Opt.SetLR(sch.StepLR(e.pos(e.step).Steps, e.at.Epochs))
	}
	r.share = e.shareOf(b.N)
}

// shareOf is the share (Replica.share) of a rank with n samples at this
// part's current step: n times the world size over the step's block
// where the epoch's end makes blocks uneven; 0 (taken as 1) with
// DropLast or no block left.
func (e *epochRun) shareOf(n int) float32 {
	if block := min(e.block, e.left-e.step*e.block); block > 0 && !e.cfg.Train.Sampler.DropLast {
		return float32(n*e.r.Coll.Size()) / float32(block)
	}
	return 0
}

// peerBatch is rank's batch at this part's current step (the one being
// taken), as its own loader gives it, with its share.
func (e *epochRun) peerBatch(rank int) (*data.Batch, float32, error) {
	idx, ok := e.peerIdx[rank]
	if !ok {
		l := e.loader.Sampler
		l.Rank = rank
		var err error
		if idx, err = l.Indices(e.at.Epochs); err != nil {
			return nil, 0, err
		}
		if e.peerIdx == nil {
			e.peerIdx = map[int][]int{}
		}
		e.peerIdx[rank] = idx
	}
	bs := e.loader.BatchSize
	lo := min(e.step*bs, len(idx))
	if err := e.loader.Fill(&e.peerB, e.at.Epochs, idx[lo:min(lo+bs, len(idx))]); err != nil {
		return nil, 0, err
	}
	return &e.peerB, e.shareOf(e.peerB.N), nil
}

// errEpochEnd ends an epoch part early on a rank that was behind when its
// last outer round closed (LocalSGD with a Deadline).
var errEpochEnd = errors.New("train: the epoch's last outer round has closed")

// trained reports a step's indices once the step cannot be taken back.
func (e *epochRun) trained(index []int, step int) {
	if e.cfg.Trained == nil && e.cfg.Blocks == nil {
		return
	}
	blk := e.blockOf(step)
	if e.r.roundOpen() {
		// The loader reuses the batch once this returns: keep a copy.
		e.open = append(e.open, slices.Clone(index))
		e.openBlocks = append(e.openBlocks, blk)
		return
	}
	done := Unapplied{Epoch: e.at.Epochs, Index: append(e.open, index), Blocks: append(e.openBlocks, blk)}
	done.report(e.cfg)
	e.open, e.openBlocks = e.open[:0], e.openBlocks[:0]
}

// blockOf is block step of this epoch part (the zero Block without
// RunConfig.Blocks).
func (e *epochRun) blockOf(step int) Block {
	if e.perm == nil {
		return Block{}
	}
	from := min(step*e.block, len(e.perm))
	return Block{From: e.at.Skip + from, Index: e.perm[from:min(from+e.block, len(e.perm))]}
}

// newcomer is ErrNewcomer after a step whose trailer said one waits.
func (e *epochRun) newcomer() error {
	if e.r.out.newcomer {
		return ErrNewcomer
	}
	return nil
}

// roundOpen reports whether a LocalSGD round is under way whose state
// is no checkpoint (Sync.roundOpen).
func (r *Replica) roundOpen() bool { return r.sync().roundOpen() }

// SyncParams makes every replica start from rank 0's parameters.
func (r *Replica) SyncParams(ctx context.Context) error {
	flat, err := r.buffer()
	if err != nil {
		return err
	}
	params := flat[:r.nparams]
	gather(params, r.Model.Params())
	if err := r.Coll.Broadcast(ctx, params, 0); err != nil {
		return fmt.Errorf("train: broadcasting parameters: %w", err)
	}
	scatter(r.Model.Params(), params)
	return nil
}
