package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// runJoin is `ringtrain join`: find the job's peers, form the ring, train,
// evaluate, and print a summary.
func runJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "job config (JSON)")
	var bootstrap, listen stringList
	fs.Var(&bootstrap, "bootstrap", "multiaddr of a peer already in the swarm, /ip4/…/tcp/…/p2p/<id> (repeatable)")
	fs.Var(&listen, "listen", "multiaddr to listen on (repeatable; default /ip4/0.0.0.0/tcp/0)")
	identity := fs.String("identity", "", "identity key file, created on first use (default: a fresh identity each run; see `ringtrain id`)")
	swarmKey := fs.String("swarm-key", "", "private swarm key file (see `ringtrain swarm-key`)")
	plane := fs.String("data-plane", "libp2p", "what carries gradients: libp2p (encrypted) or tcp (token-gated, in the clear; trusted networks)")
	modelName := fs.String("model", "", "use this built-in model instead of the config's (mlp or cnn)")
	deviceFlag := fs.String("device", "", deviceHelp+" (default: cuda if the config says gpus 1, else cpu)")
	logFlags := addLogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("join: %w: %w", errUsage, err)
	}
	if *config == "" {
		return fmt.Errorf("join: --config is required: %w", errUsage)
	}
	dp := map[string]p2p.DataPlane{"libp2p": p2p.PlaneLibp2p, "tcp": p2p.PlaneTCP}
	planeVal, ok := dp[*plane]
	if !ok {
		return fmt.Errorf("join: --data-plane %q; want libp2p or tcp: %w", *plane, errUsage)
	}
	log := logFlags.logger(stderr)
	cfg, err := loadJobConfig(*config)
	if err == nil && *modelName != "" {
		err = cfg.overrideModel(*modelName)
	}
	if err != nil {
		return fmt.Errorf("job config: %w", err)
	}
	device, err := deviceOf(*deviceFlag, cfg.GPUs)
	if err != nil {
		return fmt.Errorf("job config: %w", err)
	}
	if device == "cuda" {
		// Before the network: a peer that cannot compute must not join.
		if err := cudaAvailable(); err != nil {
			return fmt.Errorf("--device cuda: %w", err)
		}
	}

	// Data first: a broken dataset should fail before anyone waits for us.
	trainSplit, err := cfg.data.Load("train")
	if err != nil {
		return err
	}
	log.Info().Str("dataset", trainSplit.Describe()).Msg("train data")
	var testSplit *data.Split
	if cfg.data.DatasetPath.Test != "" {
		if testSplit, err = cfg.data.Load("test"); err != nil {
			return err
		}
	}

	hcfg := p2p.HostConfig{Listen: listen}
	if *identity != "" {
		if hcfg.Identity, err = p2p.LoadOrCreateIdentity(*identity); err != nil {
			return err
		}
	}
	if *swarmKey != "" {
		if hcfg.SwarmKey, err = p2p.ReadSwarmKey(*swarmKey); err != nil {
			return err
		}
	}
	if hcfg.Bootstrap, err = p2p.ParseBootstrap(bootstrap); err != nil {
		return fmt.Errorf("join: %w: %w", err, errUsage)
	}
	jctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.JoinTimeout))
	defer cancel()
	h, err := p2p.NewHost(jctx, hcfg)
	if err != nil {
		if jctx.Err() != nil {
			return fmt.Errorf("join: no bootstrap peer answered within the join timeout (%v): %w", time.Duration(cfg.JoinTimeout), err)
		}
		return err
	}
	defer h.Close()
	// The first line says where this peer can be reached, so the next
	// machine can be pointed at it.
	for _, a := range h.FullAddrs() {
		fmt.Fprintf(stdout, "listening on %s\n", a)
	}
	node, err := p2p.NewNode(h, p2p.Job{Name: cfg.Name, ConfigHash: cfg.hash, WorldSize: cfg.WorldSize}, p2p.NodeConfig{Logger: log})
	if err != nil {
		return err
	}
	defer node.Close()
	log.Info().Str("job", cfg.Name).Int("world_size", cfg.WorldSize).Str("config_hash", cfg.hash[:16]).Msg("looking for peers")
	// Ring links first: a peer that forms the ring before us dials at once.
	links := p2p.NewRingLinks(h.Host, node, p2p.LinksConfig{Plane: planeVal, Logger: log})
	defer links.Close()
	formed, err := node.Join(jctx)
	admitted := false
	if errors.Is(err, p2p.ErrStandby) {
		// Late: the ring is training. Wait, as a standby, to be let in at
		// the end of an epoch while the ring is below world_size.
		log.Info().Msg("the ring has formed without this peer; waiting as a standby to be admitted after an epoch")
		var prev *p2p.Formation
		if prev, err = node.WaitAdmission(ctx, time.Duration(cfg.JoinTimeout)); err == nil {
			rctx, cancel := context.WithTimeout(ctx, time.Duration(cfg.JoinTimeout))
			formed, err = node.Reform(rctx, prev, 1)
			cancel()
			admitted = true
		}
	}
	if err != nil {
		return fmt.Errorf("join: %w", err)
	}
	cctx, cancelConnect := context.WithTimeout(ctx, time.Duration(cfg.JoinTimeout))
	defer cancelConnect()
	t, err := links.Connect(cctx, formed)
	if err != nil {
		return err
	}
	n := len(formed.Members)
	rg, err := ring.New(t, ring.Config{Rank: formed.Rank, Size: n, Generation: formed.Generation})
	if err != nil {
		return err
	}
	defer func() { rg.Close() }() // rg changes when the ring re-forms
	rank := formed.Rank
	peerLog := log // without the rank, which can change
	log = peerLog.With().Int("rank", rank).Logger()
	fmt.Fprintf(stdout, "ring formed: rank %d of %d, generation %d\n", rank, n, formed.Generation)

	layers, err := cfg.modelSpec(trainSplit.C, trainSplit.H, trainSplit.W, len(trainSplit.Classes))
	if err != nil {
		return err
	}
	spec := train.ModelConfig{Spec: layers, Batch: cfg.BatchSize, Seed: cfg.Seed}
	model, err := newModel(device, spec)
	if err != nil {
		return err
	}
	defer model.Close()
	var opt train.Optimizer = &train.SGD{LR: cfg.Optimizer.LR, Momentum: cfg.Optimizer.Momentum, WeightDecay: cfg.Optimizer.WeightDecay}
	if cfg.Optimizer.Name == "adam" {
		a := train.NewAdam(cfg.Optimizer.LR)
		a.WeightDecay = cfg.Optimizer.WeightDecay
		opt = a
	}
	loader := func(s *data.Split, world, rank int, shuffle bool) *data.Loader {
		return &data.Loader{Split: s, BatchSize: cfg.BatchSize, Seed: cfg.Seed,
			Sampler: data.Sampler{N: s.Len(), World: world, Rank: rank, Seed: cfg.Seed, Shuffle: shuffle}}
	}
	// On a terminal, a progress bar per epoch; otherwise a log line every
	// 50 steps.
	var bar *progressBar
	every := 50
	if isTerminal(stderr) && *logFlags.format != "json" {
		bar, every = &progressBar{w: stderr}, 5
	}
	sched := cfg.schedule()
	rc := train.RunConfig{
		Schedule:      &sched,
		ProgressEvery: every,
		Replica:       train.NewReplica(model, opt, steppedRing{rg, time.Duration(cfg.StepTimeout), nil}),
		Train:         loader(trainSplit, n, rank, true), Epochs: cfg.Epochs, Classes: len(trainSplit.Classes),
		Progress: func(p train.Progress) {
			if bar != nil {
				bar.show(p, cfg.Epochs)
				if !p.EpochDone {
					return
				}
			}
			ev := log.Info().Int("epoch", p.Epoch+1).Int("step", p.Step).Int("steps", p.Steps).
				Float64("loss", p.Loss).Float64("samples_per_sec", p.SamplesPerSec)
			if p.EpochDone {
				if testSplit != nil {
					ev = ev.Float64("test_accuracy", p.TestAccuracy)
				}
				ev.Msg("epoch done")
			} else {
				ev.Msg("training")
			}
		},
	}
	if testSplit != nil {
		// Each rank scores its own slice of the test set and the counts are
		// summed over the ring, so every rank logs the whole set's result
		// in 1/n of the time (DDP users do the same by hand with a
		// DistributedSampler and an all_reduce of their metrics).
		rc.Test = loader(testSplit, n, rank, false)
		rc.Test.Sampler.Exact = true
	}
	// Rank 0 writes the checkpoint after every epoch (all replicas hold the
	// same parameters then) and when stopped by a signal; others could, but
	// on one machine they would write the same file.
	ckpt := ""
	base := train.Checkpoint{Model: spec, Seed: cfg.Seed, Classes: trainSplit.Classes, Transforms: cfg.data.Transforms,
		Input: [3]int{trainSplit.C, trainSplit.H, trainSplit.W}, WorldSize: n}
	save := func(p train.Position) error {
		if ckpt == "" {
			return nil
		}
		base.Epoch, base.Step, base.Skip = p.Epochs, p.Steps, p.Skip
		if err := rc.Replica.Snapshot(base).Save(ckpt); err != nil {
			return fmt.Errorf("writing checkpoint: %w", err)
		}
		log.Info().Str("path", ckpt).Int("epochs_done", p.Epochs).Int("steps_done", p.Steps).Msg("checkpoint written")
		return nil
	}
	if cfg.CheckpointDir != "" {
		// Whoever is rank 0 writes: after a re-formation that may be
		// another peer than at the start.
		ckpt = filepath.Join(cfg.CheckpointDir, cfg.Name+".ckpt")
		rc.Save = func(p train.Position) error {
			if rc.Replica.Coll.Rank() != 0 {
				return nil
			}
			return save(p)
		}
		rc.SaveEvery = cfg.CheckpointEvery
	}
	// switchRing connects the ring of a new formation and makes it this
	// peer's (the old one is closed by then).
	switchRing := func(ctx context.Context, f *p2p.Formation) error {
		t, err := links.Connect(ctx, f)
		if err != nil {
			return err
		}
		next, err := ring.New(t, ring.Config{Rank: f.Rank, Size: len(f.Members), Generation: f.Generation})
		if err != nil {
			t.Close()
			return err
		}
		formed, rg, rank, n = f, next, f.Rank, len(f.Members)
		log = peerLog.With().Int("rank", rank).Logger()
		return nil
	}
	// After an epoch, rank 0 lets in standbys (peers that arrived late, or
	// replacements for lost ones) while the ring is below world_size: it
	// names them to the others through the ring, tells them, and all re-form
	// with them in a new generation; they catch up from the ring.
	rc.Grow = func(gctx context.Context, at train.Position) (train.Collective, error) {
		var pick []peer.ID
		if rank == 0 {
			for _, p := range node.Standbys(formed.Members) {
				if len(formed.Members)+len(pick) < cfg.WorldSize {
					pick = append(pick, p)
				}
			}
		}
		pick, err := agreeOnPeers(gctx, rc.Replica.Coll, cfg.WorldSize, pick)
		if err != nil || len(pick) == 0 {
			return nil, err
		}
		began := time.Now()
		grown := append(slices.Clone(formed.Members), pick...)
		if rank == 0 {
			for _, p := range pick {
				if err := node.Admit(gctx, p, formed, grown); err != nil {
					log.Warn().Err(err).Msg("could not admit a standby")
				}
			}
		}
		rg.Close()
		fctx, cancel := context.WithTimeout(gctx, time.Duration(cfg.JoinTimeout))
		defer cancel()
		f, err := node.Reform(fctx, &p2p.Formation{Members: grown, Rank: rank, Generation: formed.Generation}, cfg.MinWorldSize)
		if err != nil {
			return nil, err
		}
		if err := switchRing(fctx, f); err != nil {
			return nil, err
		}
		log.Info().Int("admitted", len(pick)).Int("world_size", n).Uint64("generation", f.Generation).Int("epochs_done", at.Epochs).
			Str("took", time.Since(began).Round(time.Millisecond).String()).Msg("ring grew: admitted standbys")
		fmt.Fprintf(stdout, "ring grew: rank %d of %d, generation %d\n", rank, n, f.Generation)
		return steppedRing{rg, time.Duration(cfg.StepTimeout), nil}, nil
	}
	// A peer lost in a step (killed, unplugged, stalled past step_timeout)
	// fails that step's allreduce on every peer; the survivors agree on
	// the next generation of the ring among themselves — if at least
	// min_world_size remain — and carry on from the interrupted step.
	// A peer interrupted with Ctrl-C says so in its last step, and the
	// others re-form without it at once, the same way.
	rc.MinSize = cfg.MinWorldSize
	rc.Reform = func(rctx context.Context, cause error, at train.Position) (train.Collective, error) {
		began := time.Now()
		rg.Close()
		var gone []peer.ID
		if leave := (*train.LeaveError)(nil); errors.As(cause, &leave) {
			for _, r := range leave.Ranks {
				gone = append(gone, formed.Members[r])
			}
			log.Warn().Ints("leaving_ranks", leave.Ranks).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", n).
				Msg("peers are leaving; re-forming the ring without them")
		} else {
			log.Warn().Str("cause", cause.Error()).Int("epoch", at.Epochs+1).Int("steps_done", at.Steps).Int("world_size", n).
				Msg("a peer was lost during this step; re-forming the ring with the survivors")
		}
		fctx, cancel := context.WithTimeout(rctx, time.Duration(cfg.JoinTimeout))
		defer cancel()
		f, err := node.Reform(fctx, formed, cfg.MinWorldSize, gone...)
		if err != nil {
			return nil, err
		}
		var lost []string
		for _, p := range formed.Members {
			if !slices.Contains(f.Members, p) {
				lost = append(lost, p.String())
			}
		}
		if err := switchRing(fctx, f); err != nil {
			return nil, err
		}
		log.Warn().Strs("lost", lost).Int("world_size", n).Uint64("generation", f.Generation).
			Str("took", time.Since(began).Round(time.Millisecond).String()).Msg("ring re-formed without the lost peers; running the step again")
		fmt.Fprintf(stdout, "ring re-formed: rank %d of %d, generation %d, %d peer(s) lost\n", rank, n, f.Generation, len(lost))
		// The moment the new ring has averaged its first gradients is the
		// end of the outage; its wall-clock time is for bench-elastic.
		first := &onceHook{f: func() {
			log.Info().Uint64("generation", f.Generation).Str("since_the_step_failed", time.Since(began).Round(time.Millisecond).String()).
				Int64("unix_ms", time.Now().UnixMilli()).Msg("first step of the new generation done")
		}}
		return steppedRing{rg, time.Duration(cfg.StepTimeout), first}, nil
	}
	// A peer admitted mid-run takes the ring's state and position; a
	// restarted job carries on from the most advanced checkpoint that any
	// peer finds in its checkpoint_dir (every peer looks in its own).
	if admitted {
		start, err := rc.Replica.Admitted(ctx, rc.Replica.Coll)
		if err != nil {
			return err
		}
		rc.Start, rc.Joined = start, true
		log.Info().Int("world_size", n).Uint64("generation", formed.Generation).Int("epochs_done", start.Epochs).
			Int("steps_done", start.Steps).Msg("admitted to the ring; caught up with its parameters and optimizer state")
	} else if cfg.CheckpointDir != "" {
		found, err := findCheckpoint(filepath.Join(cfg.CheckpointDir, cfg.Name+".ckpt"), cfg.Epochs)
		if err == nil && found != nil {
			if err = rc.Replica.Restore(found); err != nil {
				err = fmt.Errorf("checkpoint in %s does not fit this job: %w (move it away to start afresh)", cfg.CheckpointDir, err)
			}
		}
		if err != nil {
			return err
		}
		start, from, err := rc.Replica.Resume(ctx, found)
		if err != nil {
			return err
		}
		if from >= 0 {
			log.Info().Int("from_rank", from).Int("epochs_done", start.Epochs).Int("steps_done", start.Steps).
				Int("samples_into_epoch", start.Skip).Msg("resuming from a checkpoint")
		}
		rc.Start = start
	}
	// SIGINT/SIGTERM (ctx) stops training on every peer after the same
	// step: this peer's next step tells the others (train.Replica.Leave),
	// all apply it and leave the ring, and rank 0 writes a checkpoint of
	// where they stopped. The collectives keep their own context, bounded
	// by the step timeout, so that the last step is not torn in half.
	rc.Stop = ctx.Done()
	log.Info().Int("world_size", n).Uint64("generation", formed.Generation).Str("device", device).Str("blas", train.BLAS).Msg("training")
	sum, err := train.Run(context.WithoutCancel(ctx), rc)
	if err == nil || errors.Is(err, train.ErrStopped) {
		leaveTogether(rg, time.Duration(cfg.StepTimeout), log)
	}
	if errors.Is(err, train.ErrStopped) {
		var leave *train.LeaveError
		errors.As(err, &leave)
		var askedBy []int
		if leave != nil {
			askedBy = leave.Ranks
		}
		log.Warn().Ints("asked_by_ranks", askedBy).Int("epochs_done", sum.Epochs).Int("steps_done", sum.Steps).
			Msg("interrupted: every peer stopped after the same step and left the ring")
		if rc.Save != nil { // rank 0 writes where the ring stopped
			if serr := rc.Save(sum.Position); serr != nil {
				return serr
			}
		}
		if ctx.Err() == nil {
			return fmt.Errorf("stopped after %d steps because rank(s) %v were interrupted: %w", sum.Steps, askedBy, err)
		}
		return fmt.Errorf("interrupted after %d steps: %w", sum.Steps, ctx.Err())
	}
	if err != nil {
		return err
	}
	if ckpt != "" {
		fmt.Fprintf(stdout, "checkpoint: %s\n", ckpt)
	}
	fmt.Fprintf(stdout, "rank %d of %d: test accuracy %.4f, param hash %s\n", rank, n, sum.TestAccuracy, sum.ParamHash[:16])
	// The summary is the peer's last log line (the logger carries rank).
	log.Info().Int("world_size", n).Int("epochs", sum.Epochs).Float64("test_accuracy", sum.TestAccuracy).Int("test_samples", sum.TestSamples).
		Float64("test_loss", sum.TestLoss).Floats64("test_accuracy_per_class", sum.PerClass).Str("param_hash", sum.ParamHash).Float64("samples_per_sec", sum.SamplesPerSec).
		Msg("summary")
	return nil
}

// agreeOnPeers sends rank 0's list of peers to every rank through the
// ring — each ID's bytes as floats, at most max of them — so that all act
// on the same one.
func agreeOnPeers(ctx context.Context, c train.Collective, max int, pick []peer.ID) ([]peer.ID, error) {
	const width = 1 + 64 // length, then up to 64 bytes of ID
	buf := make([]float32, 1+max*width)
	if c.Rank() == 0 {
		buf[0] = float32(len(pick))
		for i, p := range pick {
			b := []byte(p)
			if len(b) > 64 {
				return nil, fmt.Errorf("peer ID %s is longer than 64 bytes", p)
			}
			buf[1+i*width] = float32(len(b))
			for j, x := range b {
				buf[2+i*width+j] = float32(x)
			}
		}
	}
	if err := c.Broadcast(ctx, buf, 0); err != nil {
		return nil, fmt.Errorf("agreeing on standbys to admit: %w", err)
	}
	k := int(buf[0])
	if k < 0 || k > max {
		return nil, fmt.Errorf("rank 0 names %d standbys, at most %d expected", k, max)
	}
	out := make([]peer.ID, 0, k)
	for i := range k {
		l := int(buf[1+i*width])
		if l < 0 || l > 64 {
			return nil, fmt.Errorf("rank 0 sent a %d-byte peer ID", l)
		}
		b := make([]byte, l)
		for j := range b {
			b[j] = byte(buf[2+i*width+j])
		}
		out = append(out, peer.ID(b))
	}
	return out, nil
}

// findCheckpoint loads the checkpoint at path, if there is one. One of a
// run that has finished, or one that does not fit this job, is an error
// that says what to do: nothing is overwritten.
func findCheckpoint(path string, epochs int) (*train.Checkpoint, error) {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	c, err := train.LoadCheckpoint(path)
	if err != nil {
		return nil, fmt.Errorf("checkpoint %s: %w (move it away to start afresh)", path, err)
	}
	if c.Epoch >= epochs {
		return nil, fmt.Errorf("checkpoint %s is of a finished run (%d of %d epochs); move it away to start afresh, or raise epochs to train on", path, c.Epoch, epochs)
	}
	return c, nil
}

// leaveTogether holds a peer in the ring until every peer has finished the
// last collective. A peer that exited straight after its part of it could
// take the others' last frames down with it: its kernel answers the frames
// still arriving (acknowledgements of what it sent last) with a TCP reset,
// and a reset throws away what the neighbour had received but not yet read
// (seen: a 3-peer run whose rank 0 lost its last evaluation frame). After a
// barrier every peer has read the data that mattered; only the barrier's own
// last frames can still be lost that way, so its failure is a warning: this
// peer's results are complete either way.
func leaveTogether(rg *ring.Ring, timeout time.Duration, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := rg.Barrier(ctx); err != nil {
		log.Warn().Err(err).Msg("a peer left before confirming the end of the job; this peer's results are complete")
	}
}

// steppedRing gives every collective the step timeout, so a neighbour that
// stalls fails the step instead of hanging it.
type steppedRing struct {
	*ring.Ring
	timeout time.Duration
	first   *onceHook // if set, runs after the first AllreduceMean that succeeds
}

// onceHook runs f once.
type onceHook struct {
	once sync.Once
	f    func()
}

func (s steppedRing) AllreduceMean(ctx context.Context, buf []float32) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	err := s.Ring.AllreduceMean(ctx, buf)
	if err == nil && s.first != nil {
		s.first.once.Do(s.first.f)
	}
	return err
}

func (s steppedRing) AllreduceSum(ctx context.Context, buf []float32) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.AllreduceSum(ctx, buf)
}

func (s steppedRing) Broadcast(ctx context.Context, buf []float32, root int) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.Ring.Broadcast(ctx, buf, root)
}

// logFlags are --log-level and --log-format.
type logFlags struct{ level, format *string }

func addLogFlags(fs *flag.FlagSet) logFlags {
	return logFlags{
		level:  fs.String("log-level", "info", "debug, info, warn or error"),
		format: fs.String("log-format", "auto", "console, json, or auto (console on a terminal)"),
	}
}

// logger builds the one logger of the process: human console output on a
// terminal, JSON lines otherwise.
func (f logFlags) logger(w io.Writer) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(*f.level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	tty := isTerminal(w)
	if *f.format == "console" || *f.format == "auto" && tty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !tty}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger()
}

func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := file.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressBar redraws one line: epoch, bar, step/steps, loss, samples/s, ETA.
type progressBar struct{ w io.Writer }

func (b *progressBar) show(p train.Progress, epochs int) {
	const width = 30
	done := min(width*p.Step/max(p.Steps, 1), width)
	eta := time.Duration(0)
	if p.Step > 0 {
		eta = p.Elapsed * time.Duration(p.Steps-p.Step) / time.Duration(p.Step)
	}
	fmt.Fprintf(b.w, "\repoch %d/%d [%s%s] %d/%d loss %.4f %.0f samples/s ETA %v ",
		p.Epoch+1, epochs, strings.Repeat("=", done), strings.Repeat(" ", width-done), p.Step, p.Steps, p.Loss, p.SamplesPerSec, eta.Round(time.Second))
	if p.EpochDone {
		fmt.Fprintln(b.w)
	}
}
