package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/elastic"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// joinFlags are `ringtrain join`'s flags.
type joinFlags struct {
	config, identity, swarmKey, model, device string
	metrics                                   string
	threads                                   int
	bootstrap, listen                         stringList
	plane                                     p2p.DataPlane
	log                                       logFlags
	engine                                    *deviceOptions
	nat                                       *natFlags
}

// runJoin is `ringtrain join`: find the job's peers, form the ring, train,
// evaluate, and print a summary. The job itself is train/elastic's; this
// wires flags and config to it.
func runJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseJoinFlags(args, stderr)
	if err != nil {
		return err
	}
	log, closeLog, err := f.log.open(stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	if f.threads > 0 {
		// The CPU engine's matrix products and conv layers split their
		// work over GOMAXPROCS goroutines.
		runtime.GOMAXPROCS(f.threads)
	}
	cfg, device, err := f.jobConfig()
	if err != nil {
		return err
	}
	// Data first: a broken dataset should fail before anyone waits for us.
	trainSplit, testSplit, err := loadSplits(cfg, log)
	if err != nil {
		return err
	}
	peer, err := startPeer(ctx, f, cfg, stdout, log)
	if err != nil {
		return err
	}
	defer peer.close()
	job, model, err := newJob(cfg, device, *f.engine, trainSplit, testSplit, peer.members, stdout, stderr, f.log, log)
	if err != nil {
		return err
	}
	defer model.Close()
	if f.metrics != "" {
		m := newMetrics()
		addr, stop, err := m.serve(ctx, f.metrics)
		if err != nil {
			return fmt.Errorf("--metrics: %w", err)
		}
		defer stop()
		fmt.Fprintf(stdout, "metrics on http://%s/metrics\n", addr)
		report := job.Training.Progress
		job.Training.Progress = func(p train.Progress) {
			m.observe(p, testSplit != nil)
			report(p)
		}
	}
	sum, err := job.Run(ctx)
	if err != nil {
		return err
	}
	if job.Checkpoint != "" && job.Rank() == 0 { // rank 0 writes it; the others hold the same
		fmt.Fprintf(stdout, "checkpoint: %s\n", job.Checkpoint)
	}
	fmt.Fprintf(stdout, "rank %d of %d: test accuracy %.4f, param hash %s\n", job.Rank(), len(peer.members.Members()), sum.TestAccuracy, sum.ParamHash[:16])
	// The summary is the peer's last log line.
	job.Log().Info().Int("world_size", len(peer.members.Members())).Int("epochs", sum.Epochs).Float64("test_accuracy", sum.TestAccuracy).
		Int("test_samples", sum.TestSamples).Float64("test_loss", sum.TestLoss).Floats64("test_accuracy_per_class", sum.PerClass).
		Str("param_hash", sum.ParamHash).Float64("samples_per_sec", sum.SamplesPerSec).
		Func(func(e *zerolog.Event) { addShares(e, job.Training.Replica.Stats) }).
		Ints("stragglers", job.Training.Replica.Stragglers()).Msg("summary")
	return nil
}

func parseJoinFlags(args []string, stderr io.Writer) (*joinFlags, error) {
	var f joinFlags
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "job config (JSON)")
	fs.Var(&f.bootstrap, "bootstrap", "multiaddr of a peer already in the swarm, /ip4/…/tcp/…/p2p/<id> (repeatable)")
	fs.Var(&f.listen, "listen", "multiaddr to listen on (repeatable; default /ip4/0.0.0.0/tcp/0)")
	fs.StringVar(&f.identity, "identity", "", "identity key file, created on first use (default: a fresh identity each run; see: ringtrain id)")
	fs.StringVar(&f.swarmKey, "swarm-key", "", "private swarm key file (see: ringtrain swarm-key)")
	plane := fs.String("data-plane", "libp2p", "what carries gradients: libp2p (encrypted) or tcp (token-gated, in the clear; trusted networks)")
	fs.StringVar(&f.model, "model", "", "use this built-in model instead of the config's (mlp or cnn)")
	fs.StringVar(&f.device, "device", "", deviceHelp+" (default: cuda if the config says gpus 1, else cpu)")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads this peer computes with (GOMAXPROCS; 0: all cores, or what GOMAXPROCS says); with --device host, Go gets one more, for the ring")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9100; port 0 picks one)")
	f.engine = addDeviceFlags(fs)
	f.nat = addNATFlags(fs, "auto")
	f.log = addLogFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("join: %w: %w", errUsage, err)
	}
	if f.config == "" {
		return nil, fmt.Errorf("join: --config is required: %w", errUsage)
	}
	if err := f.nat.apply(&p2p.HostConfig{}); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if f.threads < 0 {
		return nil, fmt.Errorf("join: --threads %d; want 0 (all) or more: %w", f.threads, errUsage)
	}
	planes := map[string]p2p.DataPlane{"libp2p": p2p.PlaneLibp2p, "tcp": p2p.PlaneTCP}
	var ok bool
	if f.plane, ok = planes[*plane]; !ok {
		return nil, fmt.Errorf("join: --data-plane %q; want libp2p or tcp: %w", *plane, errUsage)
	}
	return &f, nil
}

// jobConfig loads the job config, with --model applied, and the device to
// compute on; a peer asked for CUDA that has none fails before the network.
func (f *joinFlags) jobConfig() (*jobConfig, string, error) {
	cfg, err := loadJobConfig(f.config)
	if err == nil && f.model != "" {
		err = cfg.overrideModel(f.model)
	}
	if err != nil {
		return nil, "", fmt.Errorf("job config: %w", err)
	}
	device, err := deviceOf(f.device, cfg.GPUs)
	if err != nil {
		return nil, "", fmt.Errorf("job config: %w", err)
	}
	if device == "cuda" {
		if err := cudaAvailable(); err != nil {
			return nil, "", fmt.Errorf("--device cuda: %w", err)
		}
	}
	return cfg, device, nil
}

func loadSplits(cfg *jobConfig, log zerolog.Logger) (trainSplit, testSplit *data.Split, err error) {
	if trainSplit, err = cfg.data.Load("train"); err != nil {
		return nil, nil, err
	}
	log.Info().Str("dataset", trainSplit.Describe()).Msg("train data")
	if cfg.data.DatasetPath.Test != "" {
		if testSplit, err = cfg.data.Load("test"); err != nil {
			return nil, nil, err
		}
	}
	return trainSplit, testSplit, nil
}

// peerNet is this peer's place in the swarm: host, agreement, ring links.
type peerNet struct {
	host    *p2p.Host
	node    *p2p.Node
	links   *p2p.RingLinks
	members *p2p.Membership
}

func (p *peerNet) close() {
	p.links.Close()
	p.node.Close()
	p.host.Close()
}

// startPeer starts the host — its first lines say where it can be reached,
// so that the next machine can be pointed at it — and the job's node and
// ring links.
func startPeer(ctx context.Context, f *joinFlags, cfg *jobConfig, stdout io.Writer, log zerolog.Logger) (*peerNet, error) {
	hcfg := p2p.HostConfig{Listen: f.listen, Logger: log}
	if err := f.nat.apply(&hcfg); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	// A relay serves only peers that proved they hold this job's key.
	var relayFor atomic.Pointer[p2p.Node] // the node, once it exists
	hcfg.RelayFor = func(p peer.ID) bool { n := relayFor.Load(); return n != nil && n.Verified(p) }
	var err error
	if f.identity != "" {
		if hcfg.Identity, err = p2p.LoadOrCreateIdentity(f.identity); err != nil {
			return nil, err
		}
	}
	if f.swarmKey != "" {
		if hcfg.SwarmKey, err = p2p.ReadSwarmKey(f.swarmKey); err != nil {
			return nil, err
		}
	}
	if hcfg.Bootstrap, err = p2p.ParseBootstrap(f.bootstrap); err != nil {
		return nil, fmt.Errorf("join: %w: %w", err, errUsage)
	}
	timeout := time.Duration(cfg.JoinTimeout)
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h, err := p2p.NewHost(hctx, hcfg)
	if err != nil {
		if hctx.Err() != nil {
			return nil, fmt.Errorf("join: no bootstrap peer answered within the join timeout (%v): %w", timeout, err)
		}
		return nil, err
	}
	for _, a := range h.FullAddrs() {
		fmt.Fprintf(stdout, "listening on %s\n", a)
	}
	node, err := p2p.NewNode(h, p2p.Job{Name: cfg.Name, ConfigHash: cfg.hash, WorldSize: cfg.WorldSize}, p2p.NodeConfig{Logger: log})
	if err != nil {
		h.Close()
		return nil, err
	}
	relayFor.Store(node)
	log.Info().Str("job", cfg.Name).Int("world_size", cfg.WorldSize).Str("config_hash", cfg.hash[:16]).Msg("looking for peers")
	// Ring links first: a peer that forms the ring before us dials at once.
	links := p2p.NewRingLinks(h.Host, node, p2p.LinksConfig{Plane: f.plane, Logger: log})
	return &peerNet{host: h, node: node, links: links, members: p2p.NewMembership(node, links, timeout)}, nil
}

// newJob builds the model, optimizer, data loaders and checkpointing of
// the job, and the progress reports: a bar per epoch on a terminal, a log
// line every 50 steps otherwise.
func newJob(cfg *jobConfig, device string, devOpt deviceOptions, trainSplit, testSplit *data.Split, members elastic.Membership,
	stdout, stderr io.Writer, lf logFlags, log zerolog.Logger) (*elastic.Job, train.Model, error) {
	layers, err := cfg.modelSpec(trainSplit.C, trainSplit.H, trainSplit.W, len(trainSplit.Classes))
	if err != nil {
		return nil, nil, err
	}
	spec := train.ModelConfig{Spec: layers, Batch: cfg.BatchSize, Seed: cfg.Seed}
	if device == "host" {
		// The engine computes on the threads it had (train/gemm's
		// products, as gorgonia's); Go gets one more, for the ring to
		// send gradient buckets on while backward computes.
		devOpt.hostThreads = runtime.GOMAXPROCS(0)
		runtime.GOMAXPROCS(devOpt.hostThreads + 1)
	}
	model, err := newModel(device, spec, devOpt)
	if err != nil {
		return nil, nil, err
	}
	var opt train.Optimizer = &train.SGD{LR: cfg.Optimizer.LR, Momentum: cfg.Optimizer.Momentum, WeightDecay: cfg.Optimizer.WeightDecay}
	if cfg.Optimizer.Name == "adam" {
		a := train.NewAdam(cfg.Optimizer.LR)
		a.WeightDecay = cfg.Optimizer.WeightDecay
		opt = a
	}
	if opt, err = bindOptimizer(model, opt, devOpt); err != nil {
		model.Close()
		return nil, nil, err
	}
	if s := cfg.Sync; s != nil {
		opt = &train.LocalSGD{Inner: opt, Every: s.Every, LR: s.Outer.LR, Momentum: s.Outer.Momentum, Nesterov: s.Outer.Name == "nesterov"}
	}
	// World size and rank are the ring's, set by train.Run.
	loader := func(s *data.Split, shuffle bool) *data.Loader {
		return &data.Loader{Split: s, BatchSize: cfg.BatchSize, Seed: cfg.Seed,
			Sampler: data.Sampler{N: s.Len(), World: 1, Seed: cfg.Seed, Shuffle: shuffle}}
	}
	sched := cfg.schedule()
	job := &elastic.Job{Members: members, WorldSize: cfg.WorldSize, MinWorldSize: cfg.MinWorldSize,
		StepTimeout: time.Duration(cfg.StepTimeout), Logger: log, Out: stdout}
	rep := train.NewReplica(model, opt, nil)
	rep.NormGuard = cfg.GradNormGuard
	rep.Wire = cfg.wire
	rep.BucketBytes = cfg.bucket
	job.Training = train.RunConfig{Replica: rep, Train: loader(trainSplit, true),
		Epochs: cfg.Epochs, Classes: len(trainSplit.Classes), Schedule: &sched, SaveEvery: cfg.CheckpointEvery}
	if testSplit != nil {
		// Each rank scores its own slice of the test set and the counts are
		// summed over the ring, so every rank logs the whole set's result
		// in 1/n of the time (DDP users do the same by hand with a
		// DistributedSampler and an all_reduce of their metrics).
		job.Training.Test = loader(testSplit, false)
		job.Training.Test.Sampler.Exact = true
	}
	if cfg.CheckpointDir != "" {
		job.Checkpoint = filepath.Join(cfg.CheckpointDir, cfg.Name+".ckpt")
		job.CheckpointBase = train.Checkpoint{Model: spec, Seed: cfg.Seed, Classes: trainSplit.Classes, Transforms: cfg.data.Transforms,
			Input: [3]int{trainSplit.C, trainSplit.H, trainSplit.W}}
	}
	var bar *progressBar
	job.Training.ProgressEvery = 50
	if isTerminal(stderr) && *lf.format != "json" {
		bar, job.Training.ProgressEvery = &progressBar{w: stderr}, 5
	}
	job.Training.Progress = func(p train.Progress) {
		if bar != nil {
			bar.show(p, cfg.Epochs)
			if !p.EpochDone {
				return
			}
		}
		ev := job.Log().Info().Int("epoch", p.Epoch+1).Int("step", p.Step).Int("steps", p.Steps).
			Float64("loss", p.Loss).Float64("samples_per_sec", p.SamplesPerSec).Float64("elapsed_s", p.Elapsed.Seconds())
		if !p.EpochDone {
			ev.Msg("training")
			return
		}
		if testSplit != nil {
			ev = ev.Float64("test_accuracy", p.TestAccuracy)
		}
		addShares(ev, p.Stats).Int("world_size", p.WorldSize).Floats64("rank_compute_s", p.RankCompute).
			Ints("stragglers", p.Stragglers).Msg("epoch done")
	}
	threads := runtime.GOMAXPROCS(0)
	if devOpt.hostThreads > 0 {
		threads = devOpt.hostThreads
	}
	log.Info().Str("device", device).Str("blas", train.BLAS()).Int("threads", threads).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("compute")
	return job, model, nil
}

// addShares logs where a replica's step time went, as shares of it all
// (compute, waiting for the other ranks, the ring, the optimizer), and what
// it skipped, re-formed and sent, and the seconds themselves: the figures
// DDP users time by hand. With gradient buckets, compute is forward and
// backward with the ring running beside it; ring is what is left of the
// ring once backward is done.
func addShares(e *zerolog.Event, s train.ReplicaStats) *zerolog.Event {
	total := (s.Compute + s.Wait + s.Ring + s.Optimizer).Seconds()
	share := func(d time.Duration) float64 {
		if total == 0 {
			return 0
		}
		return math.Round(d.Seconds()/total*1000) / 1000
	}
	return e.Float64("share_compute", share(s.Compute)).Float64("share_wait", share(s.Wait)).
		Float64("share_ring", share(s.Ring)).Float64("share_optimizer", share(s.Optimizer)).
		Int("skipped_steps", s.Skipped).Int("reformations", s.Reforms).Int("forged_leave_requests", s.ForgedLeaves).Int64("sent_bytes", s.BytesSent).
		Int("steps", s.Steps).Float64("compute_s", s.Compute.Seconds()).Float64("wait_s", s.Wait.Seconds()).
		Float64("ring_s", s.Ring.Seconds()).Float64("optimizer_s", s.Optimizer.Seconds())
}

// logFlags are --log-level, --log-format and --log-file.
type logFlags struct{ level, format, file *string }

func addLogFlags(fs *flag.FlagSet) logFlags {
	return logFlags{
		level:  fs.String("log-level", "info", "debug, info, warn or error"),
		format: fs.String("log-format", "auto", "console, json, or auto (console on a terminal)"),
		file:   fs.String("log-file", "", "also write every log line to this file as JSON (ringtrain plot draws the training curves from it)"),
	}
}

// open builds the one logger of the process: human console output on a
// terminal, JSON lines otherwise, and with --log-file JSON lines to that
// file as well; the func closes the file.
func (f logFlags) open(w io.Writer) (zerolog.Logger, func(), error) {
	lvl, err := zerolog.ParseLevel(*f.level)
	if err != nil {
		lvl = zerolog.InfoLevel
	}
	tty := isTerminal(w)
	if *f.format == "console" || *f.format == "auto" && tty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !tty}
	}
	closeFile := func() {}
	if *f.file != "" {
		file, err := os.OpenFile(*f.file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return zerolog.Nop(), nil, fmt.Errorf("--log-file: %w", err)
		}
		w, closeFile = zerolog.MultiLevelWriter(w, file), func() { file.Close() }
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), closeFile, nil
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
