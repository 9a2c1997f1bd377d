package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/devices"
	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/elastic"
	"github.com/ringtrain/ringtrain/train/trace"
)

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// joinFlags are `ringtrain join`'s flags.
type joinFlags struct {
	config, identity, swarmKey, model, device string
	job, serve, data, cacheDir, checkpointDir string
	requestSize                               int
	dataMemory                                string
	joinTimeout                               time.Duration
	metrics, trace                            string
	threads                                   int
	bootstrap, listen                         stringList
	plane                                     p2p.DataPlane
	log                                       logFlags
	engine                                    *devices.Options
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
	j := &joinRun{f: f, stdout: stdout, stderr: stderr}
	defer j.close()
	if err := j.openOutput(); err != nil {
		return err
	}
	if err := j.readLocal(ctx); err != nil {
		return err
	}
	if err := j.connect(ctx); err != nil {
		return err
	}
	if j.cfg.Pipeline != nil {
		observe, err := j.serveMetrics(ctx)
		if err != nil {
			return err
		}
		return runPipeline(ctx, j.cfg, j.device, j.trainSplit, j.testSplit, j.peer.members, j.stdout, j.status, tracerOf(j.tracer), observe, j.log)
	}
	job, err := j.job(ctx)
	if err != nil {
		return err
	}
	sum, err := job.Run(ctx)
	return j.report(job, sum, err)
}

// joinRun is one peer's run of join: where its output goes, the job's
// config and data, its host and node, each closed at the end in the
// order opened, the last first.
type joinRun struct {
	f                     *joinFlags
	stdout, stderr        io.Writer
	status                io.Writer // progress records: the display's, or local's pipe
	view                  *display
	tracer                *trace.File
	log                   zerolog.Logger
	cfg                   *jobConfig
	device                string
	joinTimeout           time.Duration
	trainSplit, testSplit *data.Split
	metrics               *metrics
	host                  *p2p.Host
	served                *servedData
	peer                  *peerNet
	closers               []func()
}

// later has close run f, after what was opened since.
func (j *joinRun) later(f func()) { j.closers = append(j.closers, f) }

func (j *joinRun) close() {
	for i := len(j.closers) - 1; i >= 0; i-- {
		j.closers[i]()
	}
}

// openOutput opens the live display (on a terminal), the timeline and
// the log.
func (j *joinRun) openOutput() error {
	var err error
	if j.status, j.view, err = openStatus(j.stderr, j.f.log); err != nil {
		return err
	}
	if j.view != nil {
		// The display shows the events; the log goes to --log-file.
		j.later(j.view.close)
		if isTerminal(j.stdout) {
			// On the same screen, output goes above the bars, not
			// across them; redirected, it stays where it was sent.
			j.stdout = &lineWriter{d: j.view}
		}
	}
	if j.f.trace != "" {
		if j.tracer, err = trace.Create(j.f.trace, "peer"); err != nil {
			return err
		}
		j.later(func() {
			if err := j.tracer.Close(); err != nil {
				fmt.Fprintf(j.stderr, "ringtrain: --trace: %v\n", err)
			}
		})
	}
	// The job's events go into the timeline from the log's records; the
	// progress records go to status alone.
	logTee := j.status
	if j.tracer != nil {
		logTee = joinWriters(j.status, traceEvents{j.tracer})
	}
	log, closeLog, err := j.f.log.open(j.stderr, logTee, j.view != nil)
	if err != nil {
		return err
	}
	j.log = log
	j.later(closeLog)
	return nil
}

// readLocal reads what this machine has before anything goes on the
// network: the job config, if given, and its local dataset — a broken one
// should fail before anyone is told where this peer listens, or waits
// for it.
func (j *joinRun) readLocal(ctx context.Context) error {
	f := j.f
	if f.threads > 0 {
		// The CPU engine's matrix products and conv layers split their
		// work over GOMAXPROCS goroutines.
		runtime.GOMAXPROCS(f.threads)
	}
	var err error
	if f.config != "" {
		if j.cfg, j.device, err = f.jobConfig(); err != nil {
			return err
		}
	}
	j.joinTimeout = 60 * time.Second // a fetched config's own is not known yet
	switch {
	case j.cfg != nil:
		j.joinTimeout = time.Duration(j.cfg.JoinTimeout)
	case f.joinTimeout > 0:
		j.joinTimeout = f.joinTimeout
	}
	if j.cfg != nil && j.cfg.Data.Served == "" {
		var closeData func()
		if j.trainSplit, j.testSplit, closeData, err = loadSplits(ctx, j.cfg, nil, nil, 0, j.log); err != nil {
			return err
		}
		j.later(closeData)
	}
	return nil
}

// connect starts the host, fetches the job config where none was given,
// serves the config (and --serve's data), loads served data, and starts
// the node that forms the ring.
func (j *joinRun) connect(ctx context.Context) error {
	f := j.f
	var limits p2p.Limits // a fetched config's are not known yet: the defaults
	if j.cfg != nil {
		limits = j.cfg.Limits.p2p()
	}
	if f.metrics != "" {
		j.metrics = newMetrics() // before the host, which registers libp2p's series on it
	}
	h, relayFor, err := startHost(ctx, f, j.joinTimeout, limits, j.metrics.registerer(), j.stdout, j.log)
	if err != nil {
		return err
	}
	j.host = h
	j.later(func() { h.Close() })
	if j.cfg == nil {
		if j.cfg, j.device, err = f.fetchJobConfig(ctx, h, j.joinTimeout, j.log); err != nil {
			return err
		}
	}
	cfg := j.cfg
	h.Guard.SetLimits(cfg.Limits.p2p())
	fmt.Fprintf(j.stdout, "job %s: others join it with ringtrain join --job %s --bootstrap <an address above>\n", cfg.Name, cfg.jobRef())
	handed, err := cfg.handedOut()
	if err != nil {
		return err
	}
	j.later(p2p.ServeJobConfig(h, cfg.Name, cfg.hash, handed, j.log))
	if f.serve != "" {
		if j.served, err = startServing(h, f.serve, cfg.Limits.dataServer(), j.stdout, j.log); err != nil {
			return err
		}
		j.later(j.served.close)
	}
	if j.trainSplit == nil {
		var closeData func()
		if j.trainSplit, j.testSplit, closeData, err = loadSplits(ctx, cfg, h, j.served, j.joinTimeout, j.log); err != nil {
			return err
		}
		j.later(closeData)
	}
	if j.peer, err = startNode(h, relayFor, f, cfg, j.log); err != nil {
		return err
	}
	j.later(j.peer.close)
	return nil
}

// job makes the replica job: its model on the device, the timeline, and
// the metrics endpoint.
func (j *joinRun) job(ctx context.Context) (*elastic.Job, error) {
	devOpt := *j.f.engine
	if j.device == "host" || j.device == "cpu" && j.cfg.Sync != nil && j.cfg.Sync.Overlap > 0 {
		// The model computes on the threads it had (train/gemm's
		// products); Go gets one more, for the ring to send on while it
		// computes: gradient buckets beside backward, or a streaming
		// sync's exchange beside inner steps. Without a thread of its own
		// the ring's goroutine waits for the scheduler to preempt the
		// computation (up to 10 ms) at every hop.
		devOpt.HostThreads = runtime.GOMAXPROCS(0)
		runtime.GOMAXPROCS(devOpt.HostThreads + 1)
	}
	job, model, err := newJob(j.cfg, j.device, devOpt, j.trainSplit, j.testSplit, j.peer.members, j.stdout, j.status, j.log)
	if err != nil {
		return nil, err
	}
	j.later(func() { model.Close() })
	job.Training.Replica.Trace = tracerOf(j.tracer)
	if j.tracer != nil {
		job.Training.Blocks = j.tracer.Trained // which samples each applied step trained: a churn harness counts them
	}
	obs, err := j.serveMetrics(ctx)
	if err != nil {
		return nil, err
	}
	if obs != nil {
		job.Dropped, job.Training.Progress = obs.dropped, obs.around(job.Training.Progress)
	}
	return job, nil
}

// observer is what a job reports to the metrics endpoint.
type observer struct {
	progress func(train.Progress)
	dropped  func(peers []string, why string)
}

// around is report with the metrics told of each progress first.
func (o *observer) around(report func(train.Progress)) func(train.Progress) {
	return func(p train.Progress) {
		o.progress(p)
		report(p)
	}
}

// serveMetrics serves --metrics, if asked, for either kind of job; nil
// when not asked.
func (j *joinRun) serveMetrics(ctx context.Context) (*observer, error) {
	m := j.metrics
	if m == nil {
		return nil, nil
	}
	m.guard(j.host.Guard)
	addr, stop, err := m.serve(ctx, j.f.metrics)
	if err != nil {
		return nil, fmt.Errorf("--metrics: %w", err)
	}
	j.later(stop)
	fmt.Fprintf(j.stdout, "metrics on http://%s/metrics\n", addr)
	withTest := j.testSplit != nil
	return &observer{progress: func(p train.Progress) { m.observe(p, withTest) }, dropped: m.droppedLiars}, nil
}

// report says how the job ended for this peer: a leave is what was asked
// for, not a failure, and so is a job that finished while this peer
// waited to be admitted; the summary is the peer's last log line.
func (j *joinRun) report(job *elastic.Job, sum train.Summary, err error) error {
	if errors.Is(err, elastic.ErrLeft) {
		fmt.Fprintf(j.stdout, "left the job after %d steps; the others carry on\n", sum.Steps)
		return nil
	}
	if errors.Is(err, p2p.ErrJobEnded) {
		fmt.Fprintln(j.stdout, "the job ended while this peer waited to be admitted: nothing left to train")
		j.log.Info().Err(err).Msg("the job ended before this standby was admitted")
		return nil
	}
	if err != nil {
		return err
	}
	if job.Checkpoint != "" {
		fmt.Fprintf(j.stdout, "checkpoint: %s\n", job.Checkpoint)
	}
	size := len(j.peer.members.Members())
	fmt.Fprintf(j.stdout, "rank %d of %d: %s, param hash %s\n", job.Rank(), size, j.cfg.testFigure(sum.TestAccuracy, sum.TestLoss), sum.ParamHash[:16])
	ev := job.Log().Info()
	switch {
	case j.cfg.context() > 0: // a language model: bits per byte, and no 256 classes' accuracies
		ev = ev.Float64("test_bits_per_byte", sum.TestLoss/math.Ln2)
	case j.cfg.Loss == "":
		ev = ev.Floats64("test_accuracy_per_class", sum.PerClass)
	}
	ev.Int("world_size", size).Int("epochs", sum.Epochs).Float64("test_accuracy", sum.TestAccuracy).
		Int("test_samples", sum.TestSamples).Float64("test_loss", sum.TestLoss).
		Str("param_hash", sum.ParamHash).Float64("samples_per_sec", sum.SamplesPerSec).
		Func(func(e *zerolog.Event) { addShares(e, job.Training.Replica.Stats) }).
		Ints("stragglers", job.Training.Replica.Stragglers()).Msg("summary")
	return nil
}

// testFigure is the test figure a summary line prints: the accuracy; for
// float targets, the loss (accuracy is BCE's alone; MSE's is 0); for a
// language model, the validation loss in bits per byte, the figure its
// users compare, with the next byte's accuracy after it.
func (c *jobConfig) testFigure(accuracy, loss float64) string {
	switch {
	case c.Loss != "":
		return fmt.Sprintf("test loss (%s) %.6g", c.Loss, loss)
	case c.context() > 0:
		return fmt.Sprintf("validation %.3f bits per byte (next-byte accuracy %.4f)", loss/math.Ln2, accuracy)
	}
	return fmt.Sprintf("test accuracy %.4f", accuracy)
}

func parseJoinFlags(args []string, stderr io.Writer) (*joinFlags, error) {
	var f joinFlags
	fs := flag.NewFlagSet("join", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.config, "config", "", "job config (JSON)")
	fs.StringVar(&f.job, "job", "", "instead of --config: fetch the job config from the job's peers, as name@hash (join --config prints it)")
	fs.StringVar(&f.data, "data", "", "with --job, for a job on local files: this machine's data config (where its files are)")
	fs.StringVar(&f.serve, "serve", "", "also serve this data config's dataset to other peers (as ringtrain serve does)")
	fs.StringVar(&f.cacheDir, "cache-dir", "", "keep a served dataset's samples in this folder (default: the config's cache_dir; none)")
	fs.StringVar(&f.checkpointDir, "checkpoint-dir", "", "write checkpoints here (default: the config's checkpoint_dir; with --job, none)")
	fs.DurationVar(&f.joinTimeout, "join-timeout", 0, "how long to wait for the job's config, data and peers (default: the config's join_timeout, 60s)")
	fs.IntVar(&f.requestSize, "request-size", 0, "samples per request to a data server (default: the config's request_size, 256)")
	fs.StringVar(&f.dataMemory, "data-memory", "", "the most memory a served dataset may take on this machine, e.g. 16GiB (default 8GiB); a larger one is refused before it is fetched")
	fs.Var(&f.bootstrap, "bootstrap", "multiaddr of a peer already in the swarm, /ip4/…/tcp/…/p2p/<id> (repeatable)")
	fs.Var(&f.listen, "listen", "multiaddr to listen on (repeatable; default /ip4/0.0.0.0/tcp/0)")
	fs.StringVar(&f.trace, "trace", "", "write this peer's timeline to FILE as Chrome trace-event JSON (open it in Perfetto; ringtrain trace merge puts several on one clock)")
	fs.StringVar(&f.identity, "identity", "", "identity key file, created on first use (default: a fresh identity each run; see: ringtrain id)")
	fs.StringVar(&f.swarmKey, "swarm-key", "", "private swarm key file (see: ringtrain swarm-key)")
	plane := fs.String("data-plane", "tls", "what carries gradients: tls (a direct TLS 1.3 connection per ring neighbour, bound to both peers' identities; libp2p streams where none can be had), libp2p (encrypted libp2p streams, through yamux) or tcp (token-gated, in the clear: trusted networks only)")
	fs.StringVar(&f.model, "model", "", "use this built-in model instead of the config's (mlp or cnn)")
	fs.StringVar(&f.device, "device", "", devices.Help+" (default: cuda if the config says gpus 1, else cpu)")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads this peer computes with (GOMAXPROCS; 0: all cores, or what GOMAXPROCS says); with --device host, Go gets one more, for the ring")
	fs.StringVar(&f.metrics, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics (e.g. 9100 or :9100, on 127.0.0.1; 0.0.0.0:9100 for every interface; port 0 picks one)")
	f.engine = devices.AddFlags(fs)
	f.nat = addNATFlags(fs, "auto")
	f.log = addLogFlags(fs)
	if err := parseFlags(fs, args); err != nil {
		return nil, fmt.Errorf("join: %w: %w", errUsage, err)
	}
	switch {
	case (f.config == "") == (f.job == ""):
		return nil, fmt.Errorf("join: give --config or --job (not both): %w", errUsage)
	case f.job != "" && f.model != "":
		return nil, fmt.Errorf("join: --model makes another job than --job names: %w", errUsage)
	case f.data != "" && f.job == "":
		return nil, fmt.Errorf("join: --data goes with --job; a --config names its own data: %w", errUsage)
	case f.joinTimeout < 0:
		return nil, fmt.Errorf("join: --join-timeout %v; want a positive duration: %w", f.joinTimeout, errUsage)
	case f.requestSize < 0 || f.requestSize > maxRequestSize:
		return nil, fmt.Errorf("join: --request-size %d; want 1 to %d: %w", f.requestSize, maxRequestSize, errUsage)
	}
	if f.job != "" {
		if _, _, err := parseJobRef(f.job); err != nil {
			return nil, fmt.Errorf("join: %w", err)
		}
	}
	if err := f.nat.apply(&p2p.HostConfig{}); err != nil {
		return nil, fmt.Errorf("join: %w", err)
	}
	if f.threads < 0 {
		return nil, fmt.Errorf("join: --threads %d; want 0 (all) or more: %w", f.threads, errUsage)
	}
	var err error
	if f.plane, err = p2p.ParsePlane(*plane); err != nil {
		return nil, fmt.Errorf("join: --data-plane: %w: %w", err, errUsage)
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
	return f.finish(cfg)
}

// finish applies this machine's flags to a config and picks the device.
func (f *joinFlags) finish(cfg *jobConfig) (*jobConfig, string, error) {
	if f.cacheDir != "" {
		cfg.CacheDir = f.cacheDir
	}
	if f.checkpointDir != "" {
		cfg.CheckpointDir = f.checkpointDir
	}
	if f.requestSize > 0 {
		cfg.RequestSize = f.requestSize
	}
	if f.joinTimeout > 0 {
		cfg.JoinTimeout = duration(f.joinTimeout)
	}
	if f.dataMemory != "" {
		n, err := cli.ParseBytes(f.dataMemory)
		if err != nil {
			return nil, "", fmt.Errorf("--data-memory: %w: %w", err, errUsage)
		}
		cfg.DataMemory = int64(n)
	}
	device, err := devices.Of(f.device, cfg.GPUs)
	if err != nil {
		return nil, "", fmt.Errorf("job config: %w", err)
	}
	if u := cfg.UpdateChecks; u != nil && u.AuditEvery > 0 && device != "cpu" {
		// The engine computes into the ring's buffer, not the model's.
		return nil, "", fmt.Errorf("--device %s: update_checks' audits recompute a peer's gradients on the cpu device only; set audit_every 0: %w", device, errUsage)
	}
	if device == "cuda" {
		if err := devices.CUDAAvailable(); err != nil {
			return nil, "", fmt.Errorf("--device cuda: %w", err)
		}
	}
	return cfg, device, nil
}

// fetchJobConfig gets --job's config from the job's peers: the first
// whose bytes hash to the name@hash asked for. Only the job's definition
// comes from them; this machine's settings are its own flags' and the
// defaults.
func (f *joinFlags) fetchJobConfig(ctx context.Context, h *p2p.Host, timeout time.Duration, log zerolog.Logger) (*jobConfig, string, error) {
	name, hash, _ := parseJobRef(f.job)
	if f.data != "" {
		// A --data that does not load would fail every peer's config, and
		// be blamed on them.
		if _, err := data.LoadConfig(f.data); err != nil {
			return nil, "", fmt.Errorf("join --data: %w", err)
		}
	}
	var cfg *jobConfig
	var mine error // a refusal that is this machine's doing, not the peer's
	fctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	check := func(b []byte) error {
		c, err := parseHandedOut(b, name, hash, localSettings{}, f.data)
		if err != nil && !errors.Is(err, ErrConfigHash) && mine == nil {
			// The bytes are the job's, and this machine cannot run it as
			// it is (no --data, say): no other peer's copy would do.
			mine = err
			cancel()
		}
		cfg = c
		return err
	}
	if _, err := p2p.FetchJobConfig(fctx, h, name, hash, check, log); err != nil {
		if mine != nil {
			return nil, "", fmt.Errorf("join --job: %w", mine)
		}
		return nil, "", fmt.Errorf("join --job: %w (within %v)", err, timeout)
	}
	log.Info().Str("job", f.job).Msg("fetched the job config")
	return f.finish(cfg)
}

// loadSplits opens the job's data: local files, the dataset this peer
// serves, or one that other peers serve, fetched as training reads it.
// The func closes what it opened.
func loadSplits(ctx context.Context, cfg *jobConfig, h *p2p.Host, served *servedData, timeout time.Duration, log zerolog.Logger) (trainSplit, testSplit *data.Split, closeAll func(), err error) {
	closeAll = func() {}
	switch {
	case cfg.Data.Served == "":
		if trainSplit, err = cfg.data.Load("train"); err != nil {
			return nil, nil, nil, err
		}
		if cfg.data.DatasetPath.Test != "" || cfg.data.Text != nil {
			if testSplit, err = cfg.data.Load("test"); err != nil {
				return nil, nil, nil, err
			}
		}
	case served != nil && served.m.ID() == cfg.Data.Served:
		if err := cfg.useServed(served.m); err != nil {
			return nil, nil, nil, err
		}
		trainSplit, testSplit = served.train, served.test
	default:
		octx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		c, err := p2p.OpenServedData(octx, h, cfg.Data.Served, p2p.DataClientConfig{Logger: log, Find: timeout})
		if err != nil {
			return nil, nil, nil, err
		}
		m := c.Manifest()
		err = cfg.useServed(m)
		if err == nil {
			err = cfg.fitsModel(m)
		}
		if err != nil {
			c.Close()
			return nil, nil, nil, err
		}
		rc := data.RemoteConfig{RequestSize: cfg.RequestSize, CacheDir: cfg.CacheDir, MaxBytes: cfg.DataMemory,
			OnCacheError: func(err error) { log.Warn().Err(err).Msg("served data cache") }}
		if rc.MaxBytes <= 0 {
			rc.MaxBytes = data.DefaultMaxBytes
		}
		if m.Text { // the corpus's two parts, fetched whole
			if trainSplit, err = m.RemoteText(octx, "train", c, rc); err == nil {
				testSplit, err = m.RemoteText(octx, "test", c, rc)
			}
		} else if trainSplit, err = m.Remote("train", c, rc); err == nil && m.Split("test") != nil {
			// One budget for both splits.
			rc.MaxBytes = max(rc.MaxBytes-m.Split("train").TotalBytes(), 1)
			if testSplit, err = m.Remote("test", c, rc); err != nil {
				trainSplit.Close()
			}
		}
		if errors.Is(err, data.ErrTooLarge) {
			err = fmt.Errorf("%w (join --data-memory raises the budget)", err)
		}
		if err != nil {
			c.Close()
			return nil, nil, nil, err
		}
		closeAll = func() {
			for _, s := range []*data.Split{trainSplit, testSplit} {
				if s == nil {
					continue
				}
				if st, ok := s.RemoteStats(); ok {
					log.Info().Str("dataset", cfg.Data.Served[:16]).Str("split", s.Source).Int("fetched", st.Fetched).Int("from_cache", st.Cached).
						Int("here", st.Here).Int("samples", st.Total).Msg("served data")
				}
				s.Close()
			}
			c.Close()
		}
		log.Info().Str("dataset", cfg.Data.Served).Str("servers", fmt.Sprint(c.Servers())).Int("request_size", cfg.RequestSize).Str("cache_dir", cfg.CacheDir).Msg("training on served data")
	}
	if err := cfg.textContext(trainSplit, testSplit); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	log.Info().Str("dataset", trainSplit.Describe()).Msg("train data")
	return trainSplit, testSplit, closeAll, nil
}

// peerNet is this peer's place in the job: agreement and ring links.
type peerNet struct {
	node    *p2p.Node
	links   *p2p.RingLinks
	members *p2p.Membership
}

func (p *peerNet) close() {
	p.links.Close()
	p.node.Close()
}

// startHost starts the host; its first lines say where it can be reached,
// so that the next machine can be pointed at it. The pointer is for the
// node, once there is one: a relay serves only peers that proved they hold
// this job's key.
func startHost(ctx context.Context, f *joinFlags, timeout time.Duration, limits p2p.Limits, reg prometheus.Registerer, stdout io.Writer, log zerolog.Logger) (*p2p.Host, *atomic.Pointer[p2p.Node], error) {
	hcfg, err := hostConfig(f.listen, f.bootstrap, f.identity, f.swarmKey, f.nat, log)
	if err != nil {
		return nil, nil, fmt.Errorf("join: %w", err)
	}
	if f.identity != "" {
		// The job's peers this identity saw last: any of them gets it
		// back in when those named by --bootstrap have gone. With no
		// --bootstrap they are dialled and not waited for: this may be
		// the first peer of a new job, and they a finished job's.
		known, err := p2p.KnownPeers(peersFile(f.identity))
		if err != nil {
			log.Warn().Err(err).Msg("not using the peers this identity remembers")
		}
		self, _ := peer.IDFromPrivateKey(hcfg.Identity)
		if len(hcfg.Bootstrap) > 0 {
			hcfg.Bootstrap = withKnown(hcfg.Bootstrap, known, self)
		} else {
			hcfg.Known, hcfg.KnownFor = withKnown(nil, known, self), timeout
		}
	}
	hcfg.Limits, hcfg.Registerer = limits, reg
	relayFor := new(atomic.Pointer[p2p.Node])
	hcfg.RelayFor = func(p peer.ID) bool { n := relayFor.Load(); return n != nil && n.Verified(p) }
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	h, err := p2p.NewHost(hctx, hcfg)
	if err != nil {
		if hctx.Err() != nil {
			return nil, nil, fmt.Errorf("join: no bootstrap peer answered within the join timeout (%v): %w", timeout, err)
		}
		return nil, nil, err
	}
	printAddrs(stdout, h)
	return h, relayFor, nil
}

// hostConfig is the host that join, serve and bootstrap start, from the
// flags they share.
func hostConfig(listen, bootstrap []string, identity, swarmKey string, nat *natFlags, log zerolog.Logger) (p2p.HostConfig, error) {
	cfg := p2p.HostConfig{Listen: listen, Logger: log}
	if err := nat.apply(&cfg); err != nil {
		return cfg, err
	}
	var err error
	if identity != "" {
		if cfg.Identity, err = p2p.LoadOrCreateIdentity(identity); err != nil {
			return cfg, err
		}
	}
	if swarmKey != "" {
		if cfg.SwarmKey, err = p2p.ReadSwarmKey(swarmKey); err != nil {
			return cfg, err
		}
	}
	if cfg.Bootstrap, err = p2p.ParseBootstrap(bootstrap); err != nil {
		return cfg, fmt.Errorf("%w: %w", err, errUsage)
	}
	return cfg, nil
}

// printAddrs prints where h listens, for others to be pointed at.
func printAddrs(stdout io.Writer, h *p2p.Host) {
	for _, a := range h.FullAddrs() {
		fmt.Fprintf(stdout, "listening on %s\n", a)
	}
}

// startNode starts the job's node and ring links on h.
func startNode(h *p2p.Host, relayFor *atomic.Pointer[p2p.Node], f *joinFlags, cfg *jobConfig, log zerolog.Logger) (*peerNet, error) {
	node, err := p2p.NewNode(h, cfg.p2pJob(), p2p.NodeConfig{Logger: log})
	if err != nil {
		return nil, err
	}
	relayFor.Store(node)
	log.Info().Str("job", cfg.Name).Int("world_size", cfg.WorldSize).Str("config_hash", cfg.hash[:16]).Msg("looking for peers")
	if f.plane == p2p.PlaneTCP {
		log.Warn().Msg("--data-plane tcp: gradients cross the network in clear text; anything on the path can read and alter them")
	}
	// Ring links first: a peer that forms the ring before us dials at once.
	links := p2p.NewRingLinks(h.Host, node, p2p.LinksConfig{Plane: f.plane, Logger: log, Puncher: h})
	members := p2p.NewMembership(node, links, time.Duration(cfg.JoinTimeout))
	members.Order = cfg.order
	if f.identity != "" {
		path := peersFile(f.identity)
		members.Formed = func(ids []peer.ID) {
			others := slices.DeleteFunc(slices.Clone(ids), func(id peer.ID) bool { return id == h.ID() })
			if err := p2p.RememberPeers(path, h.Host.Peerstore(), others); err != nil {
				log.Warn().Err(err).Msg("could not remember the job's peers")
			}
		}
	}
	return &peerNet{node: node, links: links, members: members}, nil
}

// peersFile is where join keeps the job's peers an identity saw last
// (p2p.RememberPeers), beside the identity's key.
func peersFile(identity string) string { return identity + ".peers" }

// withKnown is the bootstrap peers and after them the known ones that
// are neither among them nor self.
func withKnown(boot, known []peer.AddrInfo, self peer.ID) []peer.AddrInfo {
	for _, k := range known {
		if k.ID != self && !slices.ContainsFunc(boot, func(b peer.AddrInfo) bool { return b.ID == k.ID }) {
			boot = append(boot, k)
		}
	}
	return boot
}

// newJob builds the model, optimizer, data loaders and checkpointing of
// the job, and the progress reports: records on status (a live display's
// or local's) every 5 steps, a log line every 50.
func newJob(cfg *jobConfig, device string, devOpt devices.Options, trainSplit, testSplit *data.Split, members elastic.Membership,
	stdout, status io.Writer, log zerolog.Logger) (*elastic.Job, train.Model, error) {
	layers, err := cfg.modelSpec(trainSplit.C, trainSplit.H, trainSplit.W, outputsOf(trainSplit))
	if err != nil {
		return nil, nil, err
	}
	spec := train.ModelConfig{Spec: layers, Batch: cfg.BatchSize, Seed: cfg.Seed}
	model, err := devices.NewModel(device, spec, devOpt)
	if err != nil {
		return nil, nil, err
	}
	opt, err := devices.BindOptimizer(model, cfg.optimizer(model.ParamNames()), devOpt)
	if err != nil {
		model.Close()
		return nil, nil, err
	}
	job := &elastic.Job{Members: members, WorldSize: cfg.WorldSize, MinWorldSize: cfg.MinWorldSize, MaxWorldSize: cfg.MaxWorldSize,
		StepTimeout: time.Duration(cfg.StepTimeout), AdmitTimeout: time.Duration(cfg.AdmissionTimeout), Logger: log, Out: stdout}
	job.Training = cfg.runConfig(trainSplit, testSplit)
	if cfg.NonIIDShards > 0 {
		if job.Training.Train.Sampler.Groups, err = trainSplit.LabelGroups(cfg.NonIIDShards); err != nil {
			model.Close()
			return nil, nil, fmt.Errorf("non_iid_shards: %w", err)
		}
	}
	job.Training.Replica = cfg.replica(model, opt)
	if cfg.CheckpointDir != "" {
		job.Checkpoint = filepath.Join(cfg.CheckpointDir, cfg.Name+".ckpt")
		job.CheckpointBase = cfg.checkpointBase(spec, trainSplit)
	}
	job.Training.Progress, job.Training.ProgressEvery = cfg.progress(testSplit != nil, status, job.Log)
	threads := runtime.GOMAXPROCS(0)
	if devOpt.HostThreads > 0 {
		threads = devOpt.HostThreads
	}
	log.Info().Str("device", device).Str("blas", train.BLAS()).Int("threads", threads).Int("gomaxprocs", runtime.GOMAXPROCS(0)).Msg("compute")
	return job, model, nil
}

// optimizer is the job's optimizer, on the host.
func (cfg *jobConfig) optimizer(names []string) train.Optimizer {
	o := cfg.Optimizer
	var a *train.Adam
	switch o.Name {
	case "adam":
		a = train.NewAdam(o.LR)
		a.WeightDecay = o.WeightDecay
	case "adamw":
		// Decay on the tensors the reference decays: weights, not biases
		// or layernorm's (by the model's parameter names).
		w := train.NewAdamW(o.LR, o.WeightDecay, train.DecayWeights(names))
		setBetas(&w.Adam, o)
		return w
	default:
		return &train.SGD{LR: o.LR, Momentum: o.Momentum, WeightDecay: o.WeightDecay}
	}
	setBetas(a, o)
	return a
}

// setBetas puts the config's betas and eps, where given, into a.
func setBetas(a *train.Adam, o optimizerConfig) {
	if len(o.Betas) == 2 {
		a.Beta1, a.Beta2 = o.Betas[0], o.Betas[1]
	}
	if o.Eps > 0 {
		a.Eps = o.Eps
	}
}

// replica is a replica of model with the job's step options.
func (cfg *jobConfig) replica(model train.Model, opt train.Optimizer) *train.Replica {
	rep := train.NewReplica(model, opt, nil)
	var o *train.LocalSGD
	if cfg.Sync != nil {
		o = cfg.Sync.localSGD(opt, cfg.MinWorldSize)
		rep = train.NewLocalReplica(model, o, nil)
	}
	attacker(rep, o)
	rep.NormGuard = cfg.GradNormGuard
	if cfg.UpdateChecks != nil {
		rep.Sketch = cfg.UpdateChecks.sketch()
	}
	rep.ClipNorm = cfg.Optimizer.ClipGradNorm
	rep.Wire = cfg.wire
	rep.BucketBytes = cfg.BucketBytes
	return rep
}

// runConfig is the job's training run, less its replica and progress
// reports. World size and rank are the ring's, set by train.Run.
func (cfg *jobConfig) runConfig(trainSplit, testSplit *data.Split) train.RunConfig {
	loader := func(s *data.Split, shuffle bool) *data.Loader {
		return &data.Loader{Split: s, BatchSize: cfg.BatchSize, Seed: cfg.Seed,
			Sampler: data.Sampler{N: s.Len(), World: 1, Seed: cfg.Seed, Shuffle: shuffle}}
	}
	sched := cfg.schedule()
	rc := train.RunConfig{Train: loader(trainSplit, true), Epochs: cfg.Epochs, Classes: len(trainSplit.Classes),
		Schedule: &sched, SaveEvery: cfg.CheckpointEvery, EvalEvery: cfg.EvalEvery}
	if testSplit != nil {
		// Each rank scores its own slice of the test set and the counts are
		// summed over the ring, so every rank logs the whole set's result
		// in 1/n of the time (DDP users do the same by hand with a
		// DistributedSampler and an all_reduce of their metrics).
		rc.Test = loader(testSplit, false)
		rc.Test.Sampler.Exact = true
	}
	return rc
}

// checkpointBase is what a checkpoint of the job says besides its state:
// the model, the data's shape, classes and transforms.
func (cfg *jobConfig) checkpointBase(spec train.ModelConfig, trainSplit *data.Split) train.Checkpoint {
	return train.Checkpoint{Model: spec, Seed: cfg.Seed, Classes: trainSplit.Classes, Transforms: cfg.data.Transforms,
		Input: [3]int{trainSplit.C, trainSplit.H, trainSplit.W}}
}

// progress reports a run: with a status stream (a live display's, or
// local's), a progress record there every 5 steps; a log line every 50
// steps, and one per epoch.
func (cfg *jobConfig) progress(tested bool, status io.Writer, logger func() *zerolog.Logger) (func(train.Progress), int) {
	const logEvery = 50
	every := logEvery
	var records zerolog.Logger
	if status != nil {
		every, records = 5, zerolog.New(status)
	}
	return func(p train.Progress) {
		if p.Validation {
			ev := logger().Info().Int("epoch", p.Epoch+1).Int("step", p.Step).Int("steps", p.Steps)
			cfg.testFields(ev, p).Int64("sent_bytes", p.Stats.BytesSent).Msg("validation")
			return
		}
		if status != nil && !p.EpochDone {
			records.Info().Int("epoch", p.Epoch+1).Int("epochs", cfg.Epochs).Int("step", p.Step).Int("steps", p.Steps).
				Float64("loss", p.Loss).Float64("samples_per_sec", p.SamplesPerSec).Float64("elapsed_s", p.Elapsed.Seconds()).Msg(progressMessage)
		}
		ev := logger().Info().Int("epoch", p.Epoch+1).Int("step", p.Step).Int("steps", p.Steps).
			Float64("loss", p.Loss).Float64("samples_per_sec", p.SamplesPerSec).Float64("elapsed_s", p.Elapsed.Seconds())
		if !p.EpochDone {
			if p.Step%logEvery == 0 {
				ev.Msg("training")
			}
			return
		}
		if tested {
			ev = cfg.testFields(ev, p)
		}
		addShares(ev, p.Stats).Int("world_size", p.WorldSize).Floats64("rank_compute_s", p.RankCompute).
			Ints("stragglers", p.Stragglers).Msg("epoch done")
	}, every
}

// testFields logs a score of the test set: its accuracy (none for mse,
// which has no classes) and loss, and a language model's bits per byte.
func (cfg *jobConfig) testFields(ev *zerolog.Event, p train.Progress) *zerolog.Event {
	if cfg.Loss != string(train.MSE) {
		ev = ev.Float64("test_accuracy", p.TestAccuracy)
	}
	ev = ev.Float64("test_loss", p.TestLoss)
	if cfg.context() > 0 {
		ev = ev.Float64("test_bits_per_byte", p.TestLoss/math.Ln2)
	}
	return ev
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
		Int("skipped_steps", s.Skipped).Int("reformations", s.Reforms).Int("forged_leave_requests", s.ForgedLeaves).Int("audits", s.Audits).Int64("sent_bytes", s.BytesSent).
		Int("replica_steps", s.Steps).Float64("compute_s", s.Compute.Seconds()).Float64("wait_s", s.Wait.Seconds()).
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
// terminal, JSON lines otherwise (nothing on w when a live display shows
// the events instead), JSON lines to status if not nil, and with
// --log-file JSON lines to that file as well; the func closes the file.
func (f logFlags) open(w, status io.Writer, displayed bool) (zerolog.Logger, func(), error) {
	lvl, err := zerolog.ParseLevel(*f.level)
	if err != nil || lvl == zerolog.NoLevel || lvl > zerolog.ErrorLevel {
		return zerolog.Nop(), nil, fmt.Errorf("--log-level %q: want debug, info, warn or error: %w", *f.level, errUsage)
	}
	if *f.format != "auto" && *f.format != "console" && *f.format != "json" {
		return zerolog.Nop(), nil, fmt.Errorf("--log-format %q: want auto, console or json: %w", *f.format, errUsage)
	}
	tty := isTerminal(w)
	if *f.format == "console" || *f.format == "auto" && tty {
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !tty}
	}
	var outs []io.Writer
	if !displayed {
		outs = append(outs, w)
	}
	if status != nil {
		outs = append(outs, status)
	}
	closeFile := func() {}
	if *f.file != "" {
		file, err := os.OpenFile(*f.file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return zerolog.Nop(), nil, fmt.Errorf("--log-file: %w", err)
		}
		outs, closeFile = append(outs, file), func() { file.Close() }
	}
	return zerolog.New(zerolog.MultiLevelWriter(outs...)).Level(lvl).With().Timestamp().Logger(), closeFile, nil
}

// statusFDEnv names the file descriptor that `local` gives each peer for
// its status records (JSON log lines and progress).
const statusFDEnv = "RINGTRAIN_STATUS_FD"

// openStatus is where this process's status records go: the pipe `local`
// handed it, or, with the log on a terminal in the default format, a live
// display there (returned, to be closed); nil if neither.
func openStatus(stderr io.Writer, lf logFlags) (io.Writer, *display, error) {
	if fd := os.Getenv(statusFDEnv); fd != "" {
		n, err := strconv.Atoi(fd)
		if err != nil || n < 3 {
			return nil, nil, fmt.Errorf("%s=%q: not a file descriptor above 2", statusFDEnv, fd)
		}
		return os.NewFile(uintptr(n), "status"), nil, nil
	}
	if *lf.format != "auto" || !isTerminal(stderr) {
		return nil, nil, nil
	}
	d := newDisplay(stderr)
	return statusWriter{d: d, peer: 0}, d, nil
}

// isTerminal says whether w is a terminal — asked of the terminal driver
// (go-isatty), not read from the file's mode: /dev/null is a character
// device too, and `join … 2>/dev/null` from a terminal sent its result
// lines into a display nobody saw.
func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	return ok && isatty.IsTerminal(file.Fd())
}
