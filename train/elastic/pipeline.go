package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/pipeline"
)

// StageNet is what a pipeline job needs of its peers beyond a Membership:
// rings of part of the formation, and links to the stages beside a peer's
// own. p2p.Membership has it.
type StageNet interface {
	Membership
	// StageRing connects the ring of the current formation's members at
	// ranks (increasing, this peer among them).
	StageRing(ctx context.Context, ranks []int) (*ring.Ring, error)
	// Boundary connects this peer with the members at ranks prev and next
	// (−1: none), one stream both ways with each.
	Boundary(ctx context.Context, prev, next int) (toPrev, toNext io.ReadWriteCloser, err error)
}

// ErrPipelineChange means a pipeline job's membership changed — a peer
// lost, a liar caught — which a pipeline job does not survive: its peers
// stop, and it is resumed from its checkpoint.
var ErrPipelineChange = errors.New("elastic: a pipeline job's peers changed")

// PipelineJob is one peer's part of a pipeline job: the model's layers cut
// into Pipeline.Stages stages, each held by world_size / Stages peers.
// Ranks come from the one formation of all peers; stage s is held by ranks
// [s·R, (s+1)·R) (R peers per stage), which form the stage's ring and
// average its gradients; the peer at replica r of stage s sends its
// activations to replica r of stage s+1 and gets their gradients back.
//
// A stop asked of any peer (ctx's end) stops every peer after the same
// step (the step's frames tell its column, the stages' rings the rest);
// the first stage's first peer then gathers the whole model and writes it
// to Checkpoint. A peer lost ends the job with ErrPipelineChange.
//
// With a Checkpoint path, every peer also writes its stage's checkpoint
// (StagePath) after every epoch, every Training.SaveEvery steps and when
// stopped, and a job started again resumes from them: each stage's peers
// agree on their most advanced one (train.Replica.Resume), and all stages
// must be at the same step.
type PipelineJob struct {
	Members  StageNet
	Pipeline pipeline.Config
	// Model is the whole model; its Batch is each peer's batch.
	Model train.ModelConfig
	// NewReplica makes the replica of this peer's stage (its optimizer
	// and options); the job gives it its collective.
	NewReplica func(train.Model) (*train.Replica, error)
	// Training is the run; the job sets its Replica, Stop and OnSkip.
	Training train.RunConfig
	// StepTimeout bounds every collective and every wait on a stage
	// beside this one. Zero means a minute.
	StepTimeout time.Duration
	// Checkpoint, if set, is where the first stage's first peer writes
	// the whole model (CheckpointBase filled in) when the job ends or
	// stops: a file predict and export take as any job's.
	Checkpoint     string
	CheckpointBase train.Checkpoint
	Logger         zerolog.Logger
	// Out, if set, gets a line when the ring forms and the stages connect.
	Out io.Writer

	layers [][2]int // each stage's layers, once the split is agreed
}

// PipelineSummary is a pipeline peer's result: its run's, and its place.
type PipelineSummary struct {
	train.Summary
	Stage, Stages, Replica, Replicas int
	Split                            []int
	Pipe                             pipeline.Stats
}

// Run forms the ring of all peers, agrees on the split, connects this
// peer's stage ring and boundaries, trains, and gathers the model.
func (j *PipelineJob) Run(ctx context.Context) (PipelineSummary, error) {
	if j.StepTimeout <= 0 {
		j.StepTimeout = time.Minute
	}
	var sum PipelineSummary
	world, admitted, err := j.Members.Form(ctx)
	if err != nil {
		return sum, fmt.Errorf("join: %w", err)
	}
	defer world.Close()
	if admitted {
		return sum, fmt.Errorf("admitted as a newcomer to a pipeline job under way, which takes none: %w", ErrPipelineChange)
	}
	S, n := j.Pipeline.Stages, world.Size()
	if S < 1 || n%S != 0 {
		return sum, fmt.Errorf("a ring of %d peers cannot hold %d stages alike (world_size must be a multiple of stages): %w", n, S, pipeline.ErrConfig)
	}
	R := n / S
	// The collectives keep their own context, as in Job.Run: ctx's end
	// reaches the others through the step.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	log := j.Logger.With().Int("rank", world.Rank()).Logger()
	cfg := j.Pipeline
	if cfg.Split, err = j.agreeSplit(wctx, world, log); err != nil {
		return sum, err
	}
	if err := cfg.Check(j.Model.Spec, j.Model.Batch); err != nil {
		return sum, err
	}
	if j.layers, err = pipeline.Bounds(cfg.Split, S, len(j.Model.Spec.Layers)); err != nil {
		return sum, err
	}
	stage, rep := world.Rank()/R, world.Rank()%R
	sum.Stage, sum.Stages, sum.Replica, sum.Replicas, sum.Split = stage, S, rep, R, cfg.Split
	stageRing, pipe, err := j.connect(wctx, world, cfg, stage, R)
	if err != nil {
		return sum, err
	}
	defer stageRing.Close()
	defer pipe.Close()
	if j.Out != nil {
		fmt.Fprintf(j.Out, "pipeline formed: rank %d of %d, stage %d of %d, replica %d of %d, split %v, generation %d\n",
			world.Rank(), n, stage, S, rep, R, cfg.Split, world.Generation())
	}
	log.Info().Int("stage", stage).Int("stages", S).Int("replica", rep).Int("replicas", R).Ints("split", cfg.Split).
		Str("schedule", string(cfg.Schedule)).Int("micro_batches", cfg.MicroBatches).Msg("pipeline formed")
	pipe.SetStop(ctx.Done())
	r, err := j.NewReplica(pipe)
	if err != nil {
		return sum, err
	}
	r.Coll = steppedRing{Ring: stageRing, timeout: j.StepTimeout}
	rc := j.Training
	rc.Replica, rc.Stop = r, pipe.Stopping()
	if rc.OnSkip == nil {
		rc.OnSkip = func(err error) { log.Warn().Str("why", err.Error()).Msg("step skipped on every peer of the stage") }
	}
	if j.Checkpoint != "" {
		rc.Save = func(p train.Position) error { return j.saveStage(r, stage, p, log) }
		if rc.Start, err = j.resume(wctx, world, r, stage, log); err != nil {
			return sum, err
		}
		rc.InSync = true // Resume leaves the stage's replicas alike
	}
	run, err := train.Run(wctx, rc)
	sum.Summary, sum.Pipe = run, pipe.Stats()
	var leave *train.LeaveError
	switch {
	case err == nil:
	case errors.As(err, &leave):
		log.Warn().Int("epochs_done", run.Epochs).Int("steps_done", run.Steps).
			Msg("interrupted: every stage stopped after the same step")
		if rc.Save != nil {
			if serr := rc.Save(run.Position); serr != nil {
				return sum, serr
			}
		}
	default:
		var in *train.Interrupted
		if errors.As(err, &in) {
			err = fmt.Errorf("%w: %w (resume from the checkpoint)", ErrPipelineChange, err)
		}
		return sum, err
	}
	if rep == 0 {
		if gerr := j.gather(pipe, stage, run.Position, log); gerr != nil {
			return sum, gerr
		}
	}
	bctx, bcancel := context.WithTimeout(context.Background(), j.StepTimeout)
	defer bcancel()
	if berr := world.Barrier(bctx); berr != nil {
		log.Debug().Err(berr).Msg("a peer left before confirming the end of the job; this peer's results are complete")
	}
	if err != nil {
		if ctx.Err() != nil {
			return sum, fmt.Errorf("interrupted after %d steps: %w", run.Steps, ctx.Err())
		}
		return sum, fmt.Errorf("stopped after %d steps because a peer was interrupted: %w", run.Steps, train.ErrStopped)
	}
	return sum, nil
}

// agreeSplit is the configured split, or the one rank 0 balances from the
// costs it measures, sent to every peer: peers measure differently, and
// must cut alike.
func (j *PipelineJob) agreeSplit(ctx context.Context, world *ring.Ring, log zerolog.Logger) ([]int, error) {
	cfg := j.Pipeline
	if cfg.Split != nil || cfg.Stages == 1 {
		return cfg.Split, nil
	}
	buf := make([]float32, cfg.Stages-1)
	var measureErr error
	if world.Rank() == 0 {
		costs, err := pipeline.MeasureCosts(j.Model, cfg.MicroSize(j.Model.Batch))
		var cuts []int
		if err == nil {
			cuts, err = pipeline.Balance(costs, cfg.Stages)
		}
		if err != nil {
			// The others still wait for the broadcast: they get cuts
			// that no check passes, and say so.
			measureErr = err
			for i := range buf {
				buf[i] = -1
			}
		} else {
			for i, c := range cuts {
				buf[i] = float32(c)
			}
			log.Info().Floats64("layer_costs_s", costs).Ints("split", cuts).Msg("split the layers by their measured cost")
		}
	}
	bctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
	defer cancel()
	if err := world.Broadcast(bctx, buf, 0); err != nil {
		return nil, fmt.Errorf("agreeing on the split: %w", err)
	}
	if measureErr != nil {
		return nil, fmt.Errorf("measuring the layers to split them: %w", measureErr)
	}
	cuts := make([]int, len(buf))
	for i, v := range buf {
		if v != float32(math.Trunc(float64(v))) || v < 0 || v > float32(len(j.Model.Spec.Layers)) {
			return nil, fmt.Errorf("rank 0 sent the split %v: %w", buf, pipeline.ErrConfig)
		}
		cuts[i] = int(v)
	}
	if _, err := pipeline.Bounds(cuts, cfg.Stages, len(j.Model.Spec.Layers)); err != nil {
		return nil, fmt.Errorf("the split rank 0 sent: %w", err)
	}
	return cuts, nil
}

// connect opens this peer's stage ring and its boundaries, at once (each
// waits on peers that connect theirs at the same time), and builds its
// stage.
func (j *PipelineJob) connect(ctx context.Context, world *ring.Ring, cfg pipeline.Config, stage, R int) (*ring.Ring, *pipeline.Pipe, error) {
	rank := world.Rank()
	ranks := make([]int, R)
	for i := range ranks {
		ranks[i] = stage*R + i
	}
	prev, next := -1, -1
	if stage > 0 {
		prev = rank - R
	}
	if stage < cfg.Stages-1 {
		next = rank + R
	}
	var (
		wg              sync.WaitGroup
		stageRing       *ring.Ring
		toPrev, toNext  io.ReadWriteCloser
		ringErr, bndErr error
	)
	wg.Go(func() { stageRing, ringErr = j.Members.StageRing(ctx, ranks) })
	wg.Go(func() { toPrev, toNext, bndErr = j.Members.Boundary(ctx, prev, next) })
	wg.Wait()
	closeAll := func() {
		for _, c := range []io.Closer{toPrev, toNext} {
			if c != nil {
				c.Close()
			}
		}
		if stageRing != nil {
			stageRing.Close()
		}
	}
	if err := errors.Join(ringErr, bndErr); err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("connecting stage %d: %w", stage, err)
	}
	// A step sends at most its micro-batches' frames each way before it
	// waits on the stage beside it.
	queue := 2*cfg.MicroBatches + 4
	var prevLink, nextLink pipeline.Link
	if toPrev != nil {
		prevLink = pipeline.NewStreamLink(toPrev, queue)
	}
	if toNext != nil {
		nextLink = pipeline.NewStreamLink(toNext, queue)
	}
	pipe, err := pipeline.New(ctx, cfg, j.Model, stage, prevLink, nextLink)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	pipe.SetGeneration(world.Generation())
	pipe.SetTimeout(j.StepTimeout)
	return stageRing, pipe, nil
}

// gather collects the whole model on the first stage's first peer, which
// writes it.
func (j *PipelineJob) gather(pipe *pipeline.Pipe, stage int, at train.Position, log zerolog.Logger) error {
	params, err := pipe.Gather()
	if err != nil {
		return err
	}
	if stage != 0 || j.Checkpoint == "" {
		return nil
	}
	c := j.CheckpointBase
	c.Model = j.Model
	c.Epoch, c.Step, c.Skip, c.Params = at.Epochs, at.Steps, at.Skip, params
	if err := c.Save(j.Checkpoint); err != nil {
		return fmt.Errorf("writing the gathered model: %w", err)
	}
	log.Info().Str("path", j.Checkpoint).Int("epochs_done", at.Epochs).Int("steps_done", at.Steps).
		Msg("the stages' parameters gathered into one model file")
	return nil
}

// StagePath is where a peer of stage s writes its stage's checkpoint:
// beside Checkpoint, named for the stage.
func (j *PipelineJob) StagePath(s int) string {
	return fmt.Sprintf("%s.stage%d.ckpt", strings.TrimSuffix(j.Checkpoint, ".ckpt"), s)
}

func (j *PipelineJob) saveStage(r *train.Replica, stage int, p train.Position, log zerolog.Logger) error {
	base := j.CheckpointBase
	base.Model = j.Model
	base.Epoch, base.Step, base.Skip, base.WorldSize = p.Epochs, p.Steps, p.Skip, r.Coll.Size()
	base.Layers = &j.layers[stage]
	path := j.StagePath(stage)
	if err := r.Snapshot(base).Save(path); err != nil {
		return fmt.Errorf("writing stage %d's checkpoint: %w", stage, err)
	}
	log.Info().Str("path", path).Int("stage", stage).Int("epochs_done", p.Epochs).Int("steps_done", p.Steps).Msg("stage checkpoint written")
	return nil
}

// resume agrees, within the stage, on the most advanced stage checkpoint
// its peers hold, then checks that every stage starts from the same step:
// stages cut from different steps would train a model that never was.
func (j *PipelineJob) resume(ctx context.Context, world *ring.Ring, r *train.Replica, stage int, log zerolog.Logger) (train.Position, error) {
	found, err := findCheckpoint(j.StagePath(stage), j.Training.Epochs)
	if err == nil && found != nil {
		if err = r.Restore(found); err != nil {
			err = fmt.Errorf("checkpoint %s does not fit this stage: %w (move it away to start afresh)", j.StagePath(stage), err)
		}
	}
	if err != nil {
		return train.Position{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
	defer cancel()
	res, err := r.Resume(rctx, found)
	if err != nil {
		return train.Position{}, fmt.Errorf("resuming stage %d: %w", stage, err)
	}
	steps := make([]float32, world.Size())
	steps[world.Rank()] = float32(res.Steps)
	if err := world.AllreduceSum(rctx, steps); err != nil {
		return train.Position{}, fmt.Errorf("comparing the stages' positions: %w", err)
	}
	for rank, v := range steps {
		if v != steps[0] {
			return train.Position{}, fmt.Errorf("the stages would resume at different steps (rank 0 at %v, rank %d at %v): move the stage checkpoints (%s) away to start afresh: %w",
				steps[0], rank, v, j.StagePath(stage), train.ErrCheckpoint)
		}
	}
	if res.From >= 0 {
		log.Info().Int("stage", stage).Int("epochs_done", res.Epochs).Int("steps_done", res.Steps).Int("samples_into_epoch", res.Skip).
			Msg("resuming the stage from its checkpoint")
	}
	return res.Position, nil
}
