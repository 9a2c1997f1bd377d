package elastic

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
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

// ErrPipelineChange means a pipeline job lost more than it can survive: a
// stage with no peer left, or re-formations that keep failing.
var ErrPipelineChange = errors.New("elastic: a pipeline job's peers changed")

// PipelineJob is one peer's part of a pipeline job: the model's layers cut
// into Pipeline.Stages stages. Ranks come from one formation of all peers;
// at first, stage s is held by ranks [s·R, (s+1)·R), which form the
// stage's ring and average its gradients, and the peer at replica r of
// stage s sends its activations to replica r of stage s+1 and gets their
// gradients back.
//
// A stop asked of any peer (ctx's end) stops every peer after the same
// step (the step's frames tell its column, the stages' rings the rest),
// and every member learns who asked. When every stage keeps a peer
// without those that asked, they leave (Run returns ErrLeft) and the
// others go on from that step; else the job ends there, and the first
// stage's first peer gathers the whole model and writes it to
// Checkpoint. Standbys are admitted the same way: while a stage trains,
// the first peer of stage 0 looks for standbys the job has room for
// (WorldSize), and once one waits, every peer stops after the same step,
// the world grows with it, and it takes the stage with the fewest peers,
// its state from that stage's peers.
//
// A peer lost — or a stage beside one that fails — fails the step on
// every peer, and the survivors re-form; a peer its stage's replicas
// catch lying (train.LiarError) is left out of the re-formation, and ends,
// and the membership keeps it out after (Membership.Distrust), restarted
// or not. A peer keeps its stage; every
// stage then trains with as many replicas as the stage with the fewest
// peers has left, and a stage's peers beyond that wait as spares (they
// take part again when the job re-forms). Every peer keeps its stage's
// state as it was at the last two snapshots (every epoch's end and every
// Training.SaveEvery steps, default 20), and all go back to the latest
// snapshot every peer holds: nothing is applied twice, and at most the
// steps since it are done again. A stage with no peer left ends the job
// with ErrPipelineChange (resume it from the checkpoints).
//
// With a Checkpoint path, every peer also writes its stage's checkpoint
// (StagePath) at every snapshot and when stopped, and a job started again
// resumes from them: each stage's peers agree on their most advanced one
// (train.Replica.Resume), and all stages must be at the same step.
type PipelineJob struct {
	Members  StageNet
	Pipeline pipeline.Config
	// Model is the whole model; its Batch is each peer's batch.
	Model train.ModelConfig
	// NewReplica makes the replica of this peer's stage (its optimizer
	// and options); the job gives it its collective.
	NewReplica func(train.Model) (*train.Replica, error)
	// Training is the run; the job sets its Replica, Stop, Save, Start,
	// InSync and OnSkip, and SaveEvery when it is 0.
	Training train.RunConfig
	// StepTimeout bounds every collective and every wait on a stage
	// beside this one. Zero means a minute.
	StepTimeout time.Duration
	// MaxReforms is how many times in a row the job may re-form without a
	// step completed in between. Zero means 5.
	MaxReforms int
	// WorldSize is how many peers the job wants: standbys are admitted
	// up to this many members, and a stage left with no peer waits for
	// one. Zero means the first ring's size.
	WorldSize int
	// PauseTimeout bounds that wait. Zero means 10 minutes.
	PauseTimeout time.Duration
	// Checkpoint, if set, is where the first stage's first peer writes
	// the whole model (CheckpointBase filled in) when the job ends or
	// stops: a file predict and export take as any job's.
	Checkpoint     string
	CheckpointBase train.Checkpoint
	Logger         zerolog.Logger
	// Out, if set, gets a line each time the stages connect.
	Out io.Writer
	// Dropped, if set, hears of the peers dropped for lying (named by the
	// other peers of their stage), before the job re-forms without them.
	Dropped func(peers []string, why string)

	layers [][2]int // each stage's layers, once the split is agreed
}

// PipelineSummary is a pipeline peer's result: its run's, and its place.
type PipelineSummary struct {
	train.Summary
	Stage, Stages, Replica, Replicas int // Replica is −1 for a spare
	Split                            []int
	Pipe                             pipeline.Stats
	Reforms                          int // re-formations this peer took part in
}

// defaultSnapshotEvery is how often, in steps, a pipeline job keeps its
// stages' state when Training.SaveEvery does not say.
const defaultSnapshotEvery = 20

// build makes this peer's stage and its replica, and the run around them.
func (j *PipelineJob) build(wctx, ctx context.Context, cfg pipeline.Config, stage int, snaps *snapshots, log zerolog.Logger) (*pipeline.Pipe, *train.Replica, train.RunConfig, error) {
	var rc train.RunConfig
	if err := cfg.Check(j.Model.Spec, j.Model.Batch); err != nil {
		return nil, nil, rc, err
	}
	var err error
	if j.layers, err = pipeline.Bounds(cfg.Split, cfg.Stages, len(j.Model.Spec.Layers)); err != nil {
		return nil, nil, rc, err
	}
	pipe, err := pipeline.New(wctx, cfg, j.Model, stage, nil, nil)
	if err != nil {
		return nil, nil, rc, err
	}
	pipe.SetStop(ctx.Done())
	pipe.SetTimeout(j.StepTimeout)
	r, err := j.NewReplica(pipe)
	if err != nil {
		pipe.Close()
		return nil, nil, rc, err
	}
	rc = j.Training
	rc.Replica, rc.Stop = r, pipe.Stopping()
	if rc.SaveEvery == 0 {
		rc.SaveEvery = defaultSnapshotEvery
	}
	if rc.OnSkip == nil {
		rc.OnSkip = func(err error) { log.Warn().Str("why", err.Error()).Msg("step skipped on every peer of the stage") }
	}
	rc.Save = func(p train.Position) error {
		snaps.keep(j.snapshot(r, stage, p))
		if j.Checkpoint == "" {
			return nil
		}
		return j.saveStage(snaps.newest(), stage, log)
	}
	return pipe, r, rc, nil
}

// errEmptyStage is a plan with a stage nobody holds.
var errEmptyStage = errors.New("a stage has no peer left")

// pause waits, with every member, for a standby to take the stage nobody
// holds: the first member polls, all hear, and all grow the ring with it.
// The collectives run on ctx; stop (Ctrl-C) ends the wait.
func (j *PipelineJob) pause(ctx, stop context.Context, world *ring.Ring, why error, log zerolog.Logger) (*ring.Ring, error) {
	log.Warn().Err(why).Msg("the job waits for a peer to take the stage (start one with this job's config; it takes the stage from its checkpoint)")
	deadline := time.Now().Add(j.PauseTimeout)
	for {
		var add []string
		if world.Rank() == 0 {
			s := j.Members.Standbys()
			add = s[:min(len(s), max(j.WorldSize-world.Size(), 1))]
		}
		bctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
		add, err := train.BroadcastStrings(bctx, world, 0, add, maxWorldSizeOf(j), maxPeerID)
		cancel()
		if err != nil {
			return world, fmt.Errorf("%w: waiting for a peer to take the stage: %w", ErrPipelineChange, err)
		}
		if len(add) > 0 {
			admit := world.Rank() == 0
			world.Close()
			next, err := j.Members.Grow(ctx, add, admit, 1)
			if err != nil {
				return world, fmt.Errorf("admitting %v: %w", add, err)
			}
			log.Info().Strs("admitted", add).Int("world_size", next.Size()).Uint64("next_generation", next.Generation()).Msg("a peer came to take the stage")
			return next, nil
		}
		if time.Now().After(deadline) {
			return world, fmt.Errorf("%w: %v, and no peer came to take it within %v", ErrPipelineChange, why, j.PauseTimeout)
		}
		select {
		case <-stop.Done():
			return world, fmt.Errorf("interrupted while the job waited for a peer to take the stage: %w", stop.Err())
		case <-time.After(time.Second):
		}
	}
}

func maxWorldSizeOf(j *PipelineJob) int { return max(j.WorldSize, 1) }

// shareSplit gives every member the split the first member with a stage
// holds: a newcomer has none until then.
func (j *PipelineJob) shareSplit(ctx context.Context, world *ring.Ring, table []int, split []int) ([]int, error) {
	root := slices.IndexFunc(table, func(s int) bool { return s >= 0 })
	if root < 0 || j.Pipeline.Stages == 1 {
		return split, nil
	}
	buf := make([]float32, j.Pipeline.Stages-1)
	if world.Rank() == root {
		for i, c := range split {
			buf[i] = float32(c)
		}
	}
	bctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
	defer cancel()
	if err := world.Broadcast(bctx, buf, root); err != nil {
		return nil, fmt.Errorf("sharing the split: %w", err)
	}
	cuts := make([]int, len(buf))
	for i, v := range buf {
		if v != float32(math.Trunc(float64(v))) || v < 1 || v >= float32(len(j.Model.Spec.Layers)) {
			return nil, fmt.Errorf("rank %d sent the split %v: %w", root, buf, pipeline.ErrConfig)
		}
		cuts[i] = int(v)
	}
	if _, err := pipeline.Bounds(cuts, j.Pipeline.Stages, len(j.Model.Spec.Layers)); err != nil {
		return nil, fmt.Errorf("the split rank %d sent: %w", root, err)
	}
	return cuts, nil
}

// placeNewcomers gives each member with no stage (−1) the stage with the
// fewest peers (the first of those), in rank order.
func placeNewcomers(table []int, stages int) []int {
	out := slices.Clone(table)
	count := make([]int, stages)
	for _, s := range out {
		if s >= 0 && s < stages {
			count[s]++
		}
	}
	for rank, s := range out {
		if s < 0 {
			least := 0
			for k := range count {
				if count[k] < count[least] {
					least = k
				}
			}
			out[rank] = least
			count[least]++
		}
	}
	return out
}

// leave drains this peer's world links after the job's last barrier. For
// an active peer the barrier's last frames carry nothing it needs; for a
// spare they are how it learns that the job ended, and a neighbour that
// closed its socket at once could have its kernel answer them with a
// reset, which throws away what the spare had received but not read — the
// spare then takes the job's end for a lost peer.
func (j *PipelineJob) leave(world *ring.Ring, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), j.StepTimeout)
	defer cancel()
	if err := world.Leave(ctx); err != nil {
		log.Debug().Err(err).Msg("a neighbour did not close its world link before the step timeout; the job had ended")
	}
}

// finish ends the job on an active peer (its state at the stop is kept
// already): the first replicas gather the whole model, and all leave the
// ring together.
func (j *PipelineJob) finish(ctx context.Context, world *ring.Ring, pipe *pipeline.Pipe, replica, stage int, run train.Summary, err error,
	log zerolog.Logger) error {
	if err != nil {
		log.Warn().Int("epochs_done", run.Epochs).Int("steps_done", run.Steps).Msg("interrupted: every stage stopped after the same step")
	}
	if replica == 0 {
		if gerr := j.gather(pipe, stage, run.Position, log); gerr != nil {
			return gerr
		}
	}
	j.endTogether(world, log)
	switch {
	case err == nil:
		j.Members.Ended(ctx)
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted after %d steps: %w", run.Steps, ctx.Err())
	}
	return fmt.Errorf("stopped after %d steps because a peer was interrupted: %w", run.Steps, train.ErrStopped)
}

// endTogether is every member's last barrier, then its leave: a spare's
// and an active peer's alike.
func (j *PipelineJob) endTogether(world *ring.Ring, log zerolog.Logger) {
	bctx, cancel := context.WithTimeout(context.Background(), j.StepTimeout)
	defer cancel()
	if berr := world.Barrier(bctx); berr != nil {
		log.Debug().Err(berr).Msg("a peer left before confirming the end of the job; this peer's results are complete")
	}
	j.leave(world, log)
}

// stagePlan is who trains which stage in a generation: replica[rank] is a
// member's replica index in its stage, −1 for a spare; every stage has
// replicas active peers.
type stagePlan struct {
	stage    []int
	replica  []int
	replicas int
}

// planStages is a generation's plan from each member's stage (table[rank];
// −1: none). Every stage trains with as many replicas as the stage with
// the fewest peers has; in each stage the peers of the lowest ranks
// train, and the rest are spares. A stage with no peer is an error.
func planStages(table []int, stages int) (stagePlan, error) {
	count := make([]int, stages)
	for rank, s := range table {
		if s < 0 || s >= stages {
			return stagePlan{}, fmt.Errorf("rank %d holds stage %d of %d", rank, s, stages)
		}
		count[s]++
	}
	p := stagePlan{stage: table, replica: make([]int, len(table)), replicas: len(table)}
	for s, c := range count {
		if c == 0 {
			return stagePlan{}, fmt.Errorf("stage %d: %w", s, errEmptyStage)
		}
		p.replicas = min(p.replicas, c)
	}
	seen := make([]int, stages)
	for rank, s := range table {
		p.replica[rank] = -1
		if seen[s] < p.replicas {
			p.replica[rank] = seen[s]
		}
		seen[s]++
	}
	return p, nil
}

// rankOf is the rank of replica r of stage s in the plan.
func (p stagePlan) rankOf(s, r int) int {
	for rank := range p.stage {
		if p.stage[rank] == s && p.replica[rank] == r {
			return rank
		}
	}
	return -1
}

// root is the world rank of stage 0's first replica: the peer whose view
// of the standbys the generation takes.
func (p stagePlan) root() int { return p.rankOf(0, 0) }

// stageRanks are the world ranks of stage s's active peers, in order: its
// ring's members, rank for rank.
func (p stagePlan) stageRanks(s int) []int {
	ranks := make([]int, p.replicas)
	for i := range ranks {
		ranks[i] = p.rankOf(s, i)
	}
	slices.Sort(ranks)
	return ranks
}

// stageTable gathers every member's stage over the ring.
func (j *PipelineJob) stageTable(ctx context.Context, world *ring.Ring, stage int) ([]int, error) {
	buf := make([]float32, world.Size())
	buf[world.Rank()] = float32(stage + 1) // 0: a newcomer, with none yet
	tctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
	defer cancel()
	if err := world.AllreduceSum(tctx, buf); err != nil {
		return nil, fmt.Errorf("gathering the members' stages: %w", err)
	}
	table := make([]int, len(buf))
	for rank, v := range buf {
		if v != float32(int(v)) {
			return nil, fmt.Errorf("rank %d says it holds stage %v: %w", rank, v-1, pipeline.ErrConfig)
		}
		table[rank] = int(v) - 1
	}
	return table, nil
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

// connect opens this peer's stage ring and its boundaries in the plan,
// at once (each waits on peers that connect theirs at the same time), and
// gives the stage its links; closeLinks closes them.
func (j *PipelineJob) connect(ctx context.Context, world *ring.Ring, plan stagePlan, pipe *pipeline.Pipe, stage int) (_ *ring.Ring, closeLinks func(), err error) {
	me := world.Rank()
	ranks := plan.stageRanks(stage)
	rep := plan.replica[me]
	prev, next := -1, -1
	if stage > 0 {
		prev = plan.rankOf(stage-1, rep)
	}
	if stage < j.Pipeline.Stages-1 {
		next = plan.rankOf(stage+1, rep)
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
	// A step sends at most its micro-batches' frames each way before it
	// waits on the stage beside it.
	queue := 2*j.Pipeline.MicroBatches + 4
	var links []*pipeline.StreamLink
	var prevLink, nextLink pipeline.Link
	if toPrev != nil {
		l := pipeline.NewStreamLink(toPrev, queue)
		links, prevLink = append(links, l), l
	}
	if toNext != nil {
		l := pipeline.NewStreamLink(toNext, queue)
		links, nextLink = append(links, l), l
	}
	closeLinks = func() {
		for _, l := range links {
			l.Close()
		}
	}
	err = errors.Join(ringErr, bndErr)
	if err == nil {
		err = pipe.SetLinks(prevLink, nextLink)
	}
	if err != nil {
		closeLinks()
		if stageRing != nil {
			stageRing.Close()
		}
		return nil, nil, fmt.Errorf("connecting stage %d: %w", stage, err)
	}
	return stageRing, closeLinks, nil
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

// snapshot is a copy of the stage's state at p, as its checkpoint.
func (j *PipelineJob) snapshot(r *train.Replica, stage int, p train.Position) *train.Checkpoint {
	base := j.CheckpointBase
	base.Model = j.Model
	base.Epoch, base.Step, base.Skip, base.WorldSize = p.Epochs, p.Steps, p.Skip, r.Coll.Size()
	base.Layers = &j.layers[stage]
	return r.Snapshot(base)
}

func (j *PipelineJob) saveStage(c *train.Checkpoint, stage int, log zerolog.Logger) error {
	path := j.StagePath(stage)
	if err := c.Save(path); err != nil {
		return fmt.Errorf("writing stage %d's checkpoint: %w", stage, err)
	}
	log.Info().Str("path", path).Int("stage", stage).Int("epochs_done", c.Epoch).Int("steps_done", c.Step).Msg("stage checkpoint written")
	return nil
}

// snapshots are the stage's last two states kept, oldest first.
type snapshots struct{ kept []*train.Checkpoint }

func (s *snapshots) keep(c *train.Checkpoint) {
	if n := len(s.kept); n > 0 && s.kept[n-1].Step == c.Step {
		s.kept[n-1] = c
		return
	}
	if s.kept = append(s.kept, c); len(s.kept) > 2 {
		s.kept = s.kept[1:]
	}
}

func (s *snapshots) newest() *train.Checkpoint { return s.kept[len(s.kept)-1] }

// at is the snapshot of step, or nil.
func (s *snapshots) at(step int) *train.Checkpoint {
	for _, c := range s.kept {
		if c.Step == step {
			return c
		}
	}
	return nil
}

// agreeStart is where a generation starts, the same for every stage. At
// the first, each stage's peers agree on the most advanced checkpoint they
// hold (train.Replica.Resume), and all stages must be at the same step.
// After a re-formation, every active peer goes back to the latest
// snapshot all of them hold; a newcomer takes its stage's state from the
// stage's other peers, or, alone in it, from its own checkpoint of the
// stage at that step. Spares (r nil) take part in the world's collectives
// and offer nothing.
func (j *PipelineJob) agreeStart(ctx context.Context, world *ring.Ring, plan stagePlan, r *train.Replica, stage int, snaps *snapshots,
	first bool, log zerolog.Logger) (train.Position, error) {
	rctx, cancel := context.WithTimeout(ctx, j.StepTimeout)
	defer cancel()
	var found *train.Checkpoint
	target := -1
	ownCheckpoint := func() (*train.Checkpoint, error) {
		return ownCheckpoint(j.StagePath(stage), j.Training.Epochs, r)
	}
	if first {
		if r != nil {
			var err error
			if found, err = ownCheckpoint(); err != nil {
				return train.Position{}, err
			}
		}
	} else {
		// Each peer's snapshots' steps, two slots a rank (step+1; 0 for
		// none): the start is the latest step each stage's active peers
		// hold (commonStep).
		held := make([]float32, 2*world.Size())
		if r != nil {
			for k, c := range snaps.kept {
				held[2*world.Rank()+k] = float32(c.Step + 1)
			}
		}
		if err := world.AllreduceSum(rctx, held); err != nil {
			return train.Position{}, fmt.Errorf("comparing the peers' snapshots: %w", err)
		}
		if target = commonStep(held, plan); target < 0 {
			return train.Position{}, fmt.Errorf("%w: the peers hold no snapshot in common (%v)", ErrPipelineChange, held)
		}
		switch {
		case r == nil:
		case snaps.at(target) != nil:
			if found = snaps.at(target); r.Restore(found) != nil {
				return train.Position{}, fmt.Errorf("%w: restoring the snapshot of step %d", ErrPipelineChange, target)
			}
			log.Info().Int("stage", stage).Int("epochs_done", found.Epoch).Int("steps_done", found.Step).Msg("back to the latest snapshot every peer holds")
		default: // a newcomer, or a spare whose snapshots are stale
			c, err := ownCheckpoint()
			if err != nil {
				return train.Position{}, err
			}
			if c != nil && c.Step == target {
				found = c
			}
		}
	}
	var res train.Resumed
	if r != nil {
		var err error
		if res, err = r.Resume(rctx, found); err != nil {
			return train.Position{}, fmt.Errorf("resuming stage %d: %w", stage, err)
		}
	}
	steps := make([]float32, world.Size())
	if r != nil {
		steps[world.Rank()] = float32(res.Steps + 1)
	}
	if err := world.AllreduceSum(rctx, steps); err != nil {
		return train.Position{}, fmt.Errorf("comparing the stages' positions: %w", err)
	}
	want := float32(target + 1)
	for rank, v := range steps {
		switch {
		case v == 0:
		case want <= 0:
			want = v
		case v != want:
			return train.Position{}, fmt.Errorf("the stages would start at different steps (%v and %v, rank %d): a stage's peers must hold its state at the same step — its checkpoint (%s) for a peer that takes a stage alone: %w",
				want-1, v-1, rank, j.StagePath(stage), train.ErrCheckpoint)
		}
	}
	if res.From >= 0 && first {
		log.Info().Int("stage", stage).Int("epochs_done", res.Epochs).Int("steps_done", res.Steps).Int("samples_into_epoch", res.Skip).
			Msg("resuming the stage from its checkpoint")
	}
	return res.Position, nil
}

// commonStep is the latest step of which every stage whose active peers
// hold any snapshot has one holding a snapshot, from two slots a rank of
// step+1 (0: none); −1 if none. An active peer that does not hold it — a
// newcomer, or a spare again active whose snapshots went stale while its
// stage trained on — takes it from its stage's peers that do; a stage of
// newcomers alone, from their own checkpoints of the stage (agreeStart
// checks that they are of that step).
func commonStep(held []float32, plan stagePlan) int {
	stages := 0
	for _, st := range plan.stage {
		stages = max(stages, st+1)
	}
	holds := make([]bool, stages) // the stage's active peers hold any snapshot
	for rank, rep := range plan.replica {
		if rep >= 0 && (held[2*rank] != 0 || held[2*rank+1] != 0) {
			holds[plan.stage[rank]] = true
		}
	}
	best := -1
	for rank, rep := range plan.replica {
		for k := range 2 {
			v := held[2*rank+k]
			if rep < 0 || v == 0 || int(v)-1 <= best {
				continue
			}
			has := make([]bool, stages)
			for st := range has {
				has[st] = !holds[st]
			}
			for other, orep := range plan.replica {
				if h := held[2*other : 2*other+2]; orep >= 0 && (h[0] == v || h[1] == v) {
					has[plan.stage[other]] = true
				}
			}
			if !slices.Contains(has, false) {
				best = int(v) - 1
			}
		}
	}
	return best
}
