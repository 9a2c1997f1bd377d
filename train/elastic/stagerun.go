package elastic

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/pipeline"
)

// stageRun is one pipeline peer's run as it goes: the ring of all peers
// (world), this peer's stage, replica and run, and the budget of
// re-formations. Run drives it one generation of the world at a time.
type stageRun struct {
	j *PipelineJob
	// stop is the caller's context, whose end stops the job; ctx the
	// collectives', which stop does not cancel: it reaches the others
	// through the step, as in Job.Run.
	stop, ctx context.Context
	world     *ring.Ring
	stage     int // −1 until a newcomer is given one
	cfg       pipeline.Config
	pipe      *pipeline.Pipe
	r         *train.Replica
	rc        train.RunConfig
	snaps     snapshots
	spent     *budget
	sum       PipelineSummary
	log       zerolog.Logger
}

// Run forms the ring of all peers, agrees on the split, and trains its
// stage — re-forming when peers are lost, and without the peers caught
// lying — until the job ends or stops.
func (j *PipelineJob) Run(ctx context.Context) (PipelineSummary, error) {
	j.StepTimeout = orDefault(j.StepTimeout, defaultStepTimeout)
	j.MaxReforms = orDefault(j.MaxReforms, defaultMaxReforms)
	j.PauseTimeout = orDefault(j.PauseTimeout, defaultPauseTimeout)
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	s := &stageRun{j: j, stop: ctx, ctx: wctx, stage: -1, cfg: j.Pipeline, spent: newBudget(j.MaxReforms), log: j.Logger}
	defer s.close()
	admitted, err := s.form()
	for first := !admitted; err == nil; first = false {
		var done bool
		if done, err = s.generation(first); done {
			break
		}
	}
	return s.sum, err
}

// close closes the stage, then the world.
func (s *stageRun) close() {
	if s.pipe != nil {
		s.pipe.Close()
	}
	if s.world != nil {
		s.world.Close()
	}
}

// form joins the first world. A peer of it takes the stage its rank gives
// (ranks [s·R, (s+1)·R) hold stage s), and all agree on the split; a
// newcomer admitted to a world under way is given its stage later.
func (s *stageRun) form() (admitted bool, err error) {
	world, admitted, err := s.j.Members.Form(s.stop)
	if err != nil {
		return false, fmt.Errorf("join: %w", err)
	}
	s.world, s.log = world, s.j.Logger.With().Int("rank", world.Rank()).Logger()
	if admitted {
		return true, nil
	}
	n, stages := world.Size(), s.j.Pipeline.Stages
	if stages < 1 || n%stages != 0 {
		return false, fmt.Errorf("a ring of %d peers cannot hold %d stages alike (world_size must be a multiple of stages): %w", n, stages, pipeline.ErrConfig)
	}
	s.j.WorldSize = orDefault(s.j.WorldSize, n)
	s.stage = world.Rank() / (n / stages)
	s.cfg.Split, err = s.j.agreeSplit(s.ctx, world, s.log)
	return false, err
}

// generation runs one generation of the world: every member placed, this
// peer trains its stage or waits as a spare, until the job ends (done) or
// the world re-forms; a stage nobody holds pauses the job for a peer to
// take it.
func (s *stageRun) generation(first bool) (done bool, err error) {
	plan, err := s.place()
	switch {
	case errors.Is(err, errEmptyStage):
		s.world, err = s.j.pause(s.ctx, s.stop, s.world, err, s.log)
		return false, err
	case err != nil:
		return false, err
	case plan.replica[s.world.Rank()] < 0:
		return s.spare(plan, first)
	}
	return s.active(plan, first)
}

// place agrees with every member on who holds which stage (a newcomer
// takes the stage with the fewest peers) and on the split, builds this
// peer's stage once it knows it, and plans who trains.
func (s *stageRun) place() (stagePlan, error) {
	j := s.j
	s.log = j.Logger.With().Int("rank", s.world.Rank()).Uint64("generation", s.world.Generation()).Logger()
	table, err := j.stageTable(s.ctx, s.world, s.stage)
	if err != nil {
		return stagePlan{}, err
	}
	if s.cfg.Split, err = j.shareSplit(s.ctx, s.world, table, s.cfg.Split); err != nil {
		return stagePlan{}, err
	}
	table = placeNewcomers(table, j.Pipeline.Stages)
	if s.pipe == nil {
		// The stage is known now: build it, and its replica, once.
		stage := table[s.world.Rank()]
		if s.pipe, s.r, s.rc, err = j.build(s.ctx, s.stop, s.cfg, stage, &s.snaps, s.log); err != nil {
			return stagePlan{}, err
		}
		s.stage = stage
		s.sum.Stage, s.sum.Stages, s.sum.Split = stage, j.Pipeline.Stages, s.cfg.Split
	}
	plan, err := planStages(table, j.Pipeline.Stages)
	switch {
	case errors.Is(err, errEmptyStage):
		return plan, err
	case err != nil:
		return plan, fmt.Errorf("%w: %w", ErrPipelineChange, err)
	}
	s.sum.Replica, s.sum.Replicas = plan.replica[s.world.Rank()], plan.replicas
	return plan, nil
}

// spare waits out a generation in which its stage has more peers than
// another: it takes part in the generation's world collectives, then
// waits for the job's end, or the world's next re-formation. Ctrl-C makes
// it leave at once.
func (s *stageRun) spare(plan stagePlan, first bool) (done bool, err error) {
	if _, err := s.j.agreeStart(s.ctx, s.world, plan, nil, s.stage, &s.snaps, first, s.log); err != nil {
		return false, err
	}
	s.log.Info().Int("stage", s.stage).Int("replicas", plan.replicas).Msg("a spare of its stage: waiting for the job to end or re-form")
	bctx, bcancel := context.WithCancel(s.ctx)
	unhook := context.AfterFunc(s.stop, bcancel)
	err = s.world.Barrier(bctx)
	unhook()
	bcancel()
	switch {
	case s.stop.Err() != nil:
		s.log.Info().Msg("left the job as a spare: the others carry on")
		return true, fmt.Errorf("left as a spare of stage %d: %w", s.stage, ErrLeft)
	case err == nil:
		s.j.leave(s.world, s.log)
		return true, nil
	}
	return false, s.reform(lost, nil, err)
}

// active trains this peer's stage for a generation: its stage's ring and
// the links beside it connected, the start agreed, it runs until the job
// ends or stops (done) or a peer fails or lies. Every peer stops after
// the same step: a leave is a stop here. A lost peer makes the world
// re-form with the survivors; liars its stage caught, without them.
func (s *stageRun) active(plan stagePlan, first bool) (done bool, err error) {
	j, me := s.j, s.world.Rank()
	stageRing, closeLinks, err := j.connect(s.ctx, s.world, plan, s.pipe, s.stage)
	if err != nil {
		return false, err
	}
	// Closed before the world re-forms: the stages beside this one hear
	// of its end from its links.
	var once sync.Once
	closeStage := func() {
		once.Do(func() {
			stageRing.Close()
			closeLinks()
		})
	}
	defer closeStage()
	s.pipe.SetGeneration(s.world.Generation())
	s.r.Coll = steppedRing{Ring: stageRing, timeout: j.StepTimeout}
	s.formed(plan)
	if s.rc.Start, err = j.agreeStart(s.ctx, s.world, plan, s.r, s.stage, &s.snaps, first, s.log); err != nil {
		return false, err
	}
	s.rc.InSync = true // the start leaves the stage's replicas alike
	s.snaps.keep(j.snapshot(s.r, s.stage, s.rc.Start))
	run, err := train.Run(s.ctx, s.rc)
	s.sum.Summary, s.sum.Pipe = s.sum.Summary.Then(run), s.pipe.Stats()
	switch ev, ranks := classify(err, stageRing.Rank(), stageRing.Size(), 1); ev {
	case finished, leaving, left, stopped:
		return true, j.finish(s.stop, s.world, s.pipe, plan.replica[me], s.stage, run, err, s.rc.Save, s.log)
	case lost, liars:
		closeStage()
		if run.Steps > s.rc.Start.Steps {
			s.spent.completed()
		}
		return false, s.reform(ev, pick(plan.stageRanks(s.stage), ranks), err) // the stage ring's ranks as the world's
	}
	return false, err
}

// formed says where this peer is in the generation.
func (s *stageRun) formed(plan stagePlan) {
	me, S := s.world.Rank(), s.j.Pipeline.Stages
	if s.j.Out != nil {
		fmt.Fprintf(s.j.Out, "pipeline formed: rank %d of %d, stage %d of %d, replica %d of %d, split %v, generation %d\n",
			me, s.world.Size(), s.stage, S, plan.replica[me], plan.replicas, s.cfg.Split, s.world.Generation())
	}
	s.log.Info().Int("stage", s.stage).Int("stages", S).Int("replica", plan.replica[me]).Int("replicas", plan.replicas).Ints("split", s.cfg.Split).
		Str("schedule", string(s.cfg.Schedule)).Int("micro_batches", s.cfg.MicroBatches).Msg("pipeline formed")
}

// reform closes the generation's world and agrees with the survivors on
// the next — without the peers at gone, the liars this peer's stage
// caught — within the re-formation budget.
func (s *stageRun) reform(ev event, gone []int, cause error) error {
	j := s.j
	old := j.Members.Members()
	if ev == liars {
		var why string
		var liar *train.LiarError
		if errors.As(cause, &liar) {
			why = liar.Why
		}
		s.log.Error().Strs("dropped", pick(old, gone)).Str("why", why).Msg("peers of this stage told the others what no honest replica could; re-forming the pipeline without them")
		j.Members.Distrust(pick(old, gone))
		if j.Dropped != nil {
			j.Dropped(pick(old, gone), why)
		}
	} else {
		s.log.Warn().Err(cause).Msg("a peer or a stage beside this one failed; re-forming the pipeline")
	}
	s.world.Close()
	s.sum.Reforms++
	if err := s.spent.spend(cause); err != nil {
		return fmt.Errorf("%w: %w", ErrPipelineChange, err)
	}
	// One peer is enough to go on with: a stage left empty pauses the job
	// for a newcomer to take it (pause).
	next, err := j.Members.Reform(s.ctx, 1, gone)
	if err != nil {
		return fmt.Errorf("re-forming the pipeline: %w", err)
	}
	for _, p := range old {
		if !slices.Contains(j.Members.Members(), p) && !slices.Contains(pick(old, gone), p) {
			s.spent.lose(p)
		}
	}
	s.world = next
	s.log.Info().Int("world_size", next.Size()).Uint64("next_generation", next.Generation()).Msg("pipeline re-formed")
	return nil
}
