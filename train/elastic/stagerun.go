package elastic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

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
	noShows   noShows // standbys admitted that did not come
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
	s := &stageRun{j: j, stop: ctx, ctx: wctx, stage: -1, cfg: j.Pipeline, spent: newBudget(j.MaxReforms), noShows: noShows{}, log: j.Logger}
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
// waits for the active peers' run to end — the job's end, a stop, a
// leave or a newcomer — and goes on with them, or for the world's next
// re-formation. Ctrl-C makes it leave at once.
func (s *stageRun) spare(plan stagePlan, first bool) (done bool, err error) {
	if _, err := s.j.agreeStart(s.ctx, s.world, plan, nil, s.stage, &s.snaps, first, s.log); err != nil {
		return false, err
	}
	s.log.Info().Int("stage", s.stage).Int("replicas", plan.replicas).Msg("a spare of its stage: waiting for the job to end or re-form")
	bctx, bcancel := context.WithCancel(s.ctx)
	unhook := context.AfterFunc(s.stop, bcancel)
	out, err := s.decide(bctx, plan, false)
	unhook()
	bcancel()
	switch {
	case s.stop.Err() != nil:
		s.log.Info().Msg("left the job as a spare: the others carry on")
		return true, fmt.Errorf("left as a spare of stage %d: %w", s.stage, ErrLeft)
	case err != nil:
		return false, s.reform(lost, nil, err)
	case out.ends(plan):
		s.j.endTogether(s.world, s.log)
		return true, nil
	}
	return false, s.change(plan, out)
}

// active trains this peer's stage for a generation: its stage's ring and
// the links beside it connected, the start agreed, it runs until the job
// ends (done), every peer stops after the same step (settle), or a peer
// fails or lies. A lost peer makes the world re-form with the survivors;
// liars its stage caught, without them.
func (s *stageRun) active(plan stagePlan, first bool) (done bool, err error) {
	j := s.j
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
	run, err := s.train(plan)
	s.sum.Summary, s.sum.Pipe = s.sum.Summary.Then(run), s.pipe.Stats()
	if run.Steps > s.rc.Start.Steps {
		s.spent.completed()
	}
	switch ev, ranks := classify(err, stageRing.Rank(), stageRing.Size(), 1); ev {
	case finished, leaving, left, stopped:
		return s.settle(plan, run, err, closeStage)
	case lost, liars:
		closeStage()
		return false, s.reform(ev, pick(plan.stageRanks(s.stage), ranks), err) // the stage ring's ranks as the world's
	}
	return false, err
}

// train runs the stage until the job ends or its column stops. The column
// stops after the same step on every peer when one is asked to (Ctrl-C)
// or, on the plan's first peer, at a step that finds a standby the job
// has room for — looked for at every step, as the replica job's rank 0
// does.
func (s *stageRun) train(plan stagePlan) (train.Summary, error) {
	stop := make(chan struct{})
	unhook := context.AfterFunc(s.stop, func() { close(stop) })
	defer unhook()
	s.pipe.SetStop(stop)
	s.pipe.SetStopWhen(nil)
	if s.world.Rank() == plan.root() {
		s.pipe.SetStopWhen(func() bool { return len(s.admittable()) > 0 })
	}
	s.rc.Stop = s.pipe.Stopping()
	return train.Run(s.ctx, s.rc)
}

// admittable are the standbys the job has room for (WorldSize), but for
// those admitted before that did not come, for a while (noShows).
func (s *stageRun) admittable() []string {
	return s.noShows.admittable(s.j.Members.Standbys(), s.j.WorldSize-s.world.Size(), time.Now())
}

// settle acts on a run that every active peer ended after the same step:
// the state there is kept (a snapshot, and the stage's checkpoint), and
// every member — spares too — learns why it ended (decide). The job ends
// with every stage stopped and the model gathered when it is done, or when
// a peer asked to stop holds a stage that no other peer holds; else the
// peers that asked leave, and the others go on from this step without
// them, or with the standbys that wait.
func (s *stageRun) settle(plan stagePlan, run train.Summary, runErr error, closeStage func()) (done bool, err error) {
	if runErr != nil {
		if err := s.rc.Save(run.Position); err != nil {
			return true, err
		}
	}
	// Bounded as every collective of an active peer is: a member that
	// stalls here (a spare stopped by a debugger, say) is a peer lost.
	dctx, cancel := context.WithTimeout(s.ctx, s.j.StepTimeout)
	out, err := s.decide(dctx, plan, runErr == nil)
	cancel()
	if err != nil {
		closeStage()
		return false, s.reform(lost, nil, err)
	}
	me := s.world.Rank()
	if out.ends(plan) {
		if !out.finished {
			runErr = cmp.Or(runErr, error(train.ErrStopped))
		}
		return true, s.j.finish(s.stop, s.world, s.pipe, plan.replica[me], s.stage, run, runErr, s.log)
	}
	closeStage()
	if slices.Contains(out.askers, me) {
		s.j.leave(s.world, s.log)
		s.log.Info().Int("stage", s.stage).Int("epochs_done", run.Epochs).Int("steps_done", run.Steps).
			Msg("left the job: its stage's other peers carry on without this one")
		return true, fmt.Errorf("left stage %d after %d steps: %w", s.stage, run.Steps, ErrLeft)
	}
	return false, s.change(plan, out)
}

// ending is why a generation's run ended, as every member learns it: the
// world ranks asked to stop, and whether the job is done.
type ending struct {
	askers   []int
	finished bool
}

// ends says whether the job ends here: it is done, or a peer asked to stop
// holds a stage that no peer but those asking holds (the others then stop
// with it, as one job).
func (e ending) ends(plan stagePlan) bool {
	if e.finished {
		return true
	}
	if len(e.askers) == 0 {
		return false
	}
	kept := make([]bool, len(plan.stage))
	for rank, st := range plan.stage {
		if !slices.Contains(e.askers, rank) {
			kept[st] = true
		}
	}
	for _, st := range plan.stage {
		if !kept[st] {
			return true
		}
	}
	return false
}

// decide gathers, over the world, which members were asked to stop and
// whether every active peer's run is done.
func (s *stageRun) decide(ctx context.Context, plan stagePlan, finished bool) (ending, error) {
	n := s.world.Size()
	buf := make([]float32, n+1)
	if s.stop.Err() != nil {
		buf[s.world.Rank()] = 1
	}
	if finished {
		buf[n] = 1
	}
	if err := s.world.AllreduceSum(ctx, buf); err != nil {
		return ending{}, fmt.Errorf("agreeing why the stages stopped: %w", err)
	}
	var e ending
	for rank, v := range buf[:n] {
		switch v {
		case 0:
		case 1:
			e.askers = append(e.askers, rank)
		default:
			return ending{}, fmt.Errorf("rank %d's stop flag summed to %v: %w", rank, v, pipeline.ErrConfig)
		}
	}
	e.finished = int(buf[n]) == plan.replicas*s.j.Pipeline.Stages
	return e, nil
}

// change goes on from a step every peer stopped after: without the peers
// that asked to leave, else with the standbys the plan's first peer would
// admit (none: the same peers, a new generation).
func (s *stageRun) change(plan stagePlan, out ending) error {
	if len(out.askers) > 0 {
		return s.reform(left, out.askers, nil)
	}
	j, root := s.j, plan.root()
	var add []string
	if s.world.Rank() == root {
		add = s.admittable()
	}
	bctx, cancel := context.WithTimeout(s.ctx, j.StepTimeout)
	add, err := train.BroadcastStrings(bctx, s.world, root, add, maxWorldSizeOf(j), maxPeerID)
	cancel()
	if err != nil {
		return s.reform(lost, nil, fmt.Errorf("sharing the standbys to admit: %w", err))
	}
	if len(add) == 0 {
		return s.reform(left, nil, nil)
	}
	admit := s.world.Rank() == 0
	s.world.Close()
	next, err := j.Members.Grow(s.ctx, add, admit, 1)
	if err != nil {
		return fmt.Errorf("%w: admitting %v: %w", ErrPipelineChange, add, err)
	}
	s.world = next
	s.noShows.admitted(add, j.Members.Members(), time.Now())
	s.log.Info().Strs("admitted", add).Int("world_size", next.Size()).Uint64("next_generation", next.Generation()).
		Msg("standbys admitted to the pipeline at a step every peer stopped after")
	return nil
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
	} else if ev == left {
		s.log.Info().Strs("leaving", pick(old, gone)).Msg("re-forming the pipeline at the step every peer stopped after")
	} else {
		s.log.Warn().Err(cause).Msg("a peer or a stage beside this one failed; re-forming the pipeline")
	}
	s.world.Close()
	s.sum.Reforms++
	if ev != left {
		if err := s.spent.spend(cause); err != nil {
			return fmt.Errorf("%w: %w", ErrPipelineChange, err)
		}
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
