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
	// zero Position otherwise.
	Start Position
	// Save, if set, is called after every epoch once the replicas are
	// known to agree, and every SaveEvery steps (if not 0) in between —
	// the place to write a checkpoint.
	Save      func(Position) error
	SaveEvery int
	// Reform, if set, is called when a collective fails in a step — a
	// peer died, left or stalled past the step timeout — with the cause
	// and where the run is; it returns the collective of the survivors (a
	// new generation of the ring). The interrupted step was applied on no
	// rank, so all still agree; Run checks that they do, shares the rest
	// of the epoch out among the new ring, and runs the step again. Unset,
	// a failed collective ends the run.
	// It is also called when ranks ask to leave (Replica.Leave) while at
	// least MinSize others stay: those carry on without them.
	Reform  func(ctx context.Context, cause error, at Position) (Collective, error)
	MinSize int
	// Grow, if set, is called after every epoch but the last; it returns
	// the collective of a larger ring when peers are to be admitted, or
	// nil. The newcomers call Admitted; every rank of the new ring then
	// holds the state of the most advanced one.
	Grow func(ctx context.Context, at Position) (Collective, error)
	// Joined says this replica was admitted mid-run (Admitted has given it
	// its state and Start): Run does not broadcast rank 0's parameters.
	Joined bool
	// MaxSkips is how many steps in a row may be skipped for non-finite
	// gradients before the run stops. Zero means 5.
	MaxSkips int
	// MaxReforms is how many times in a row the ring may re-form without a
	// step completing in between before the run stops with
	// ErrReformBudget — a peer that keeps failing every ring it is in
	// would otherwise keep the job re-forming for ever. Zero means 5.
	MaxReforms int
	// Stop, if set and closed, ends the run on every rank after one more
	// step, which carries the request to the others (Replica.Leave): Run
	// returns ErrStopped (a *LeaveError naming the ranks that asked), and
	// Summary.Epochs and Summary.Steps say where it stopped — the same on
	// every rank.
	Stop <-chan struct{}
	// Progress, if set, is called every ProgressEvery steps and at the end
	// of every epoch.
	Progress      func(Progress)
	ProgressEvery int
	// OnSkip, if set, is told why each step every rank skipped together
	// was skipped (ErrNonFinite, ErrGradientNorm: which ranks, what
	// values).
	OnSkip func(error)
}

// Progress is a report from the middle of a run.
type Progress struct {
	Epoch, Step, Steps int
	Loss               float64       // mean local loss since the last report
	SamplesPerSec      float64       // this rank's, since the epoch began
	Elapsed            time.Duration // since the epoch began
	EpochDone          bool
	TestAccuracy       float64 // with EpochDone, if there is a test set
	WorldSize          int
	Stats              ReplicaStats // the replica's, summed since it was made
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

// ErrReformBudget means the ring re-formed RunConfig.MaxReforms times in a
// row without completing a step.
var ErrReformBudget = errors.New("train: the ring keeps failing")

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
}

// Run starts every replica from rank 0's parameters (unless Joined: an
// admitted replica has its state already; a resumed one has had it from
// Replica.Resume), trains from Start to Epochs, checks at the end of each
// epoch that the replicas hold the same parameters, and evaluates.
func Run(ctx context.Context, cfg RunConfig) (Summary, error) {
	r := cfg.Replica
	if cfg.MaxSkips <= 0 {
		cfg.MaxSkips = 5
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 50
	}
	if cfg.MaxReforms <= 0 {
		cfg.MaxReforms = 5
	}
	streak := 0 // re-formations since the last step that completed
	var s Summary
	r.Steps = cfg.Start.Steps
	if cfg.Stop != nil {
		r.Leave = cfg.Stop
	}
	if !cfg.Joined {
		if err := r.SyncParams(ctx); err != nil {
			return s, err
		}
	}
	var samples int
	var busy time.Duration
	skips := 0
	totalSteps := cfg.Start.Steps
	for epoch := cfg.Start.Epochs; epoch < cfg.Epochs; epoch++ {
		if cfg.Schedule != nil {
			r.Opt.SetLR(cfg.Schedule.LR(epoch))
		}
		skip := 0
		if epoch == cfg.Start.Epochs {
			skip = cfg.Start.Skip
		}
		start := time.Now()
		step, steps, epochSamples := 0, 0, 0
		var lossSum float64
		var lossN int
		// at is the position after step steps of the epoch; positions
		// before segStep were taken by an earlier ring of another size.
		segSkip, segStep, segTake := skip, 0, 0
		at := func(step int) Position {
			return Position{Epochs: epoch, Steps: totalSteps + step,
				Skip: min(segSkip+(step-segStep)*segTake, cfg.Train.Sampler.N)}
		}
		// An epoch runs in segments, one per ring: when a peer is lost,
		// the survivors re-form (cfg.Reform), the rest of the epoch is
		// shared out among them, and the interrupted step runs again.
		for {
			train := *cfg.Train
			train.Sampler.World, train.Sampler.Rank = r.Coll.Size(), r.Coll.Rank()
			train.Sampler.Skip = segSkip
			segTake = train.Sampler.World * train.BatchSize
			steps = segStep + train.Batches()
			e, err := train.Epoch(ctx, epoch)
			if err != nil {
				return s, err
			}
			err = e.Each(func(b *data.Batch) error {
				r.closeRound = step+1 == steps // a LocalSGD round ends with the epoch
				loss, err := r.Step(ctx, b.X, b.Y, b.N)
				step++
				var leave *LeaveError
				switch {
				case errors.As(err, &leave) && !Skipped(err):
					return leave // the step was applied
				case errors.As(err, &leave):
					return err
				case Skipped(err):
					if cfg.OnSkip != nil {
						cfg.OnSkip(err)
					}
					if skips++; skips >= cfg.MaxSkips {
						return fmt.Errorf("train: %d steps in a row skipped, the last at epoch %d step %d: %w", skips, epoch, step, err)
					}
					return nil
				case errors.Is(err, ErrCollective):
					step -= r.undone // not applied here: it runs again (a LocalSGD round, all of it)
					return err
				case err != nil:
					return fmt.Errorf("train: epoch %d step %d: %w", epoch, step, err)
				}
				skips = 0
				if !r.local() || r.outerDone {
					// A LocalSGD inner step leaves the ring untried: only
					// an outer step shows that a re-formed ring works.
					streak = 0
				}
				if r.InnerSkip != nil && cfg.OnSkip != nil {
					cfg.OnSkip(r.InnerSkip)
				}
				if r.outerDone && step < steps {
					// Every outer step is checked, as every epoch is.
					if err := r.CheckInSync(ctx); err != nil {
						return err
					}
				}
				if cfg.Save != nil && cfg.SaveEvery > 0 && (totalSteps+step)%cfg.SaveEvery == 0 && step < steps && !r.roundOpen() {
					if err := cfg.Save(at(step)); err != nil {
						return err
					}
				}
				epochSamples += b.N
				lossSum += float64(loss)
				lossN++
				if cfg.Progress != nil && step%cfg.ProgressEvery == 0 {
					el := time.Since(start)
					cfg.Progress(Progress{Epoch: epoch, Step: step, Steps: steps, Loss: lossSum / float64(lossN),
						SamplesPerSec: float64(epochSamples) / el.Seconds(), Elapsed: el, WorldSize: r.Coll.Size(), Stats: r.Stats})
					lossSum, lossN = 0, 0
				}
				return nil
			})
			e.Close()
			var leave *LeaveError
			leaving := errors.As(err, &leave) && cfg.Reform != nil && !slices.Contains(leave.Ranks, r.Coll.Rank()) &&
				leave.OthersCarryOn(r.Coll.Size(), cfg.MinSize)
			if leaving || (errors.Is(err, ErrCollective) || droppable(cfg, r, err)) && cfg.Reform != nil {
				// Others left (this rank carries on without them, after the
				// step that told it) or were lost (the step failed here).
				pos, err := reform(ctx, cfg, r, err, at(step), &streak)
				if err != nil {
					return s, err
				}
				step = pos.Steps - totalSteps
				r.Steps = pos.Steps
				segSkip, segStep = pos.Skip, step
				continue
			}
			if errors.Is(err, ErrCollective) {
				err = fmt.Errorf("train: epoch %d step %d: %w", epoch, step+1, err)
			}
			if errors.Is(err, ErrStopped) {
				s.Position = at(step)
				if step == steps { // the stop came with the epoch's last step
					s.Position = Position{Epochs: epoch + 1, Steps: totalSteps + step}
				}
				return s, err
			}
			if err != nil {
				return s, err
			}
			break
		}
		elapsed := time.Since(start)
		samples += epochSamples
		busy += elapsed
		// The epoch's end: the replicas compare hashes and score the test
		// set. A peer lost here (or one that finished the epoch's last
		// step alone and came here first) makes the ring re-form and the
		// end run again.
		for {
			err := r.CheckInSync(ctx)
			var res Result
			if err == nil && cfg.Test != nil {
				res, err = evaluate(ctx, cfg)
			}
			if (errors.Is(err, ErrCollective) || droppable(cfg, r, err)) && cfg.Reform != nil {
				if _, err := reform(ctx, cfg, r, err, at(step), &streak); err != nil {
					return s, err
				}
				continue
			}
			if err != nil {
				return s, fmt.Errorf("train: after epoch %d: %w", epoch+1, err)
			}
			if cfg.Test != nil {
				s.TestLoss, s.TestAccuracy, s.PerClass, s.TestSamples = res.Loss, res.Accuracy, res.PerClass, res.Samples
				s.EpochAccuracy = append(s.EpochAccuracy, res.Accuracy)
			}
			break
		}
		totalSteps += step
		if cfg.Save != nil {
			if err := cfg.Save(Position{Epochs: epoch + 1, Steps: totalSteps}); err != nil {
				return s, err
			}
		}
		if cfg.Grow != nil && epoch+1 < cfg.Epochs {
			at := Position{Epochs: epoch + 1, Steps: totalSteps}
			c, err := cfg.Grow(ctx, at)
			if err != nil {
				return s, fmt.Errorf("train: admitting peers after epoch %d: %w", epoch+1, err)
			}
			if c != nil {
				r.Coll = c
				_, _, err := r.adoptLatest(ctx, true, at, 0)
				if err == nil {
					err = r.CheckInSync(ctx)
				}
				if (errors.Is(err, ErrCollective) || droppable(cfg, r, err)) && cfg.Reform != nil {
					_, err = reform(ctx, cfg, r, err, at, &streak)
				}
				if err != nil {
					return s, fmt.Errorf("train: bringing admitted peers up to date: %w", err)
				}
			}
		}
		if cfg.Progress != nil {
			p := Progress{Epoch: epoch, Step: step, Steps: steps, SamplesPerSec: float64(epochSamples) / elapsed.Seconds(), Elapsed: elapsed, EpochDone: true,
				WorldSize: r.Coll.Size(), Stats: r.Stats, RankCompute: r.RankCompute(), Stragglers: r.Stragglers()}
			if lossN > 0 {
				p.Loss = lossSum / float64(lossN)
			}
			if cfg.Test != nil {
				p.TestAccuracy = s.TestAccuracy
			}
			cfg.Progress(p)
		}
	}
	s.Position = Position{Epochs: cfg.Epochs, Steps: totalSteps}
	if busy > 0 {
		s.SamplesPerSec = float64(samples) / busy.Seconds()
	}
	h := r.ParamHash()
	s.ParamHash = hex.EncodeToString(h[:])
	return s, nil
}

// Admitted brings a replica admitted mid-run up to date through its new
// ring, c: the state and position of the most advanced rank. Run it while
// the ring's other ranks return from RunConfig.Grow, then Run with Start
// set to the position and Joined.
func (r *Replica) Admitted(ctx context.Context, c Collective) (Position, error) {
	r.Coll = c
	// All the old members are level at an epoch's end: none may claim to
	// be ahead (the same rule as theirs in Run, so all decide alike).
	pos, _, err := r.adoptLatest(ctx, false, Position{}, 0)
	if err != nil {
		return Position{}, fmt.Errorf("train: catching up on admission: %w", err)
	}
	if err := r.CheckInSync(ctx); err != nil {
		return Position{}, fmt.Errorf("train: after admission: %w", err)
	}
	return pos, nil
}

// droppable reports whether err names liars that the others can re-form
// without: not this rank, and enough left.
func droppable(cfg RunConfig, r *Replica, err error) bool {
	var liar *LiarError
	return errors.As(err, &liar) && !slices.Contains(liar.Ranks, r.Coll.Rank()) && r.Coll.Size()-len(liar.Ranks) >= max(cfg.MinSize, 1)
}

// reform replaces the replica's collective with the survivors' and brings
// them level. A peer lost in the middle of an allreduce can leave it done on
// some ranks — those that had every frame they needed before it went — and
// failed on others; the ones that finished have applied the step. So the
// survivors all take the parameters, optimizer state and position of the
// one furthest on (one step at most: a claim further is a lie), then check
// that they agree. Ranks caught lying are dropped: the ring re-forms again
// without them. A peer lost while the survivors level up makes it re-form
// again too. After MaxReforms in a row without a completed step (streak
// counts them), it gives up with ErrReformBudget.
func reform(ctx context.Context, cfg RunConfig, r *Replica, cause error, at Position, streak *int) (Position, error) {
	for {
		if *streak >= cfg.MaxReforms {
			return Position{}, fmt.Errorf("%w: re-formed %d times in a row without completing a step; the last cause: %w", ErrReformBudget, *streak, cause)
		}
		*streak++
		c, err := cfg.Reform(ctx, cause, at)
		if err != nil {
			return Position{}, fmt.Errorf("train: re-forming the ring after a failed step (%v): %w", cause, err)
		}
		r.Coll = c
		r.Stats.Reforms++
		pos, _, err := r.adoptLatest(ctx, true, at, r.maxAhead())
		if err == nil && pos.Epochs != at.Epochs {
			return Position{}, fmt.Errorf("train: after re-forming the ring: a survivor is in epoch %d, this one in %d", pos.Epochs+1, at.Epochs+1)
		}
		if err == nil {
			err = r.CheckInSync(ctx)
		}
		if errors.Is(err, ErrCollective) || droppable(cfg, r, err) {
			cause = err
			continue
		}
		if err != nil {
			return Position{}, fmt.Errorf("train: after re-forming the ring: %w", err)
		}
		return pos, nil
	}
}

// local reports whether the replica trains with LocalSGD (DiLoCo).
func (r *Replica) local() bool {
	_, ok := r.Opt.(*LocalSGD)
	return ok
}

// roundOpen reports whether a LocalSGD round is under way: its state is
// no checkpoint, and the ranks' parameters differ.
func (r *Replica) roundOpen() bool {
	o, ok := r.Opt.(*LocalSGD)
	return ok && o.open
}

// maxAhead is how many steps a survivor of a failed step may be ahead of
// the others: one, or with LocalSGD a round — the ranks that finished its
// outer step are at its end, the others went back to its start.
func (r *Replica) maxAhead() int {
	if o, ok := r.Opt.(*LocalSGD); ok {
		return max(o.Every, 1)
	}
	return 1
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
