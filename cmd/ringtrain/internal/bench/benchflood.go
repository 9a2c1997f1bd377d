package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/internal/flood"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// floodRow is one flood's figures: the job's throughput under it against
// the window before it, what the peers held before and after, and what the
// hostile peer managed to send.
type floodRow struct {
	Run            int         `json:"run"`
	Kind           flood.Kind  `json:"kind"`
	Baseline       float64     `json:"baseline_samples_per_s"`
	Flooded        float64     `json:"flooded_samples_per_s"`
	Ratio          float64     `json:"ratio"`
	RSSBeforeMB    float64     `json:"rss_before_mb"`     // the largest of the peers'
	RSSGrowthMB    float64     `json:"rss_growth_mb"`     // the largest peer's growth
	GoroutinesWas  int         `json:"goroutines_before"` // the peers' sum
	GoroutinesPeak int         `json:"goroutines_peak"`
	BackIn         float64     `json:"goroutines_back_in_s"` // -1: not within the settle time
	Refused        int64       `json:"refused_streams"`
	CutOff         int64       `json:"cut_off"`
	Stats          flood.Stats `json:"flooder"`
	Seconds        float64     `json:"flood_s"`
}

// Flood is `ringtrain bench flood`: a job of --peers processes
// trains on the full dataset while a hostile peer (`bench flood-peer`, a
// process of its own, at nice 19 so that the CPU it burns is not counted
// as the job's loss on a machine they share) floods the first peer with
// one kind of traffic at a time. Each flood is measured against the
// window just before it; at the end every peer is stopped after the same
// step and their checkpoints must hold one set of parameters.
func Flood(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench flood", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "testdata/flood-job.json", "the job (its epochs are many: the bench stops it)")
	serve := fs.String("serve", "testdata/fashion-mnist-full.json", "data config the first peer serves (the data floods ask for it)")
	kinds := fs.String("kinds", "all", "floods, comma-separated: "+floodKindNames())
	floodFor := fs.Duration("flood", 60*time.Second, "each flood's length")
	baseline := fs.Duration("baseline", 20*time.Second, "the window measured before each flood")
	settle := fs.Duration("settle", 10*time.Second, "after a flood, how long the peers' goroutines have to come back")
	warmup := fs.Duration("warmup", 30*time.Second, "training before the first window, for the peers' memory to reach its working size")
	runs := fs.Int("runs", 1, "floods of each kind; a row for each, then the medians")
	workers := fs.Int("workers", 16, "the hostile peer's requests at once")
	source := fs.String("from", "127.0.0.2", "the loopback address the hostile peer comes from (not 127.0.0.1, which libp2p exempts from its per-IP limits, as a machine's own peers)")
	keep := fs.Bool("keep", false, "keep the run's folder (logs, checkpoints)")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench flood: %w: %w", cli.ErrUsage, err)
	}
	plan, err := floodPlan(*kinds)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "ringtrain-flood-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintf(stderr, "bench flood: logs and checkpoints in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	job, err := startFloodJob(ctx, exe, dir, *config, *serve, 3)
	if err != nil {
		return err
	}
	defer job.kill()
	fmt.Fprintf(stderr, "bench flood: %d peers training; the first serves dataset %s\n", len(job.peers), job.dataset[:16])
	if err := job.waitTraining(ctx, 3*time.Minute); err != nil {
		return err
	}
	if err := sleepFor(ctx, *warmup); err != nil {
		return err
	}
	var rows []floodRow
	for run := 1; run <= *runs; run++ {
		for _, kind := range plan {
			row, err := job.flood(ctx, exe, kind, *source, *workers, *baseline, *floodFor, *settle)
			if err != nil {
				return err
			}
			row.Run = run
			rows = append(rows, row)
			json.NewEncoder(stdout).Encode(row)
			if err := job.alive(); err != nil {
				return fmt.Errorf("bench flood: after the %s flood: %w", kind, err)
			}
		}
	}
	hashes, err := job.stop(ctx)
	if err != nil {
		return err
	}
	one := len(hashes) == len(job.peers)
	for _, h := range hashes {
		one = one && h == hashes[0]
	}
	printFloodTable(stdout, rows, one, hashes)
	if !one {
		return fmt.Errorf("bench flood: the peers ended with parameter hashes %v; want one", hashes)
	}
	return nil
}

// floodPlan is --kinds: all, or the kinds named.
func floodPlan(kinds string) ([]flood.Kind, error) {
	if kinds == "all" {
		return flood.Kinds(), nil
	}
	var plan []flood.Kind
	for _, k := range strings.Split(kinds, ",") {
		if !slices.Contains(flood.Kinds(), flood.Kind(k)) {
			return nil, fmt.Errorf("bench flood: kind %q; want %s: %w", k, floodKindNames(), cli.ErrUsage)
		}
		plan = append(plan, flood.Kind(k))
	}
	return plan, nil
}

func floodKindNames() string {
	var s []string
	for _, k := range flood.Kinds() {
		s = append(s, string(k))
	}
	return strings.Join(s, ",")
}

// floodPeer is one of the job's processes.
type floodPeer struct {
	cmd     *exec.Cmd
	addr    string // a multiaddr with /p2p/
	config  string // its job config file
	metrics string // http://…/metrics
	ckpt    string
	exited  chan error
}

type floodJob struct {
	peers   []*floodPeer
	dataset string
	batch   int
}

// startFloodJob starts n join processes of the job in config, the first
// also serving the dataset of serve, each with its own checkpoint folder
// and metrics, and returns once each has said where it listens.
func startFloodJob(ctx context.Context, exe, dir, config, serve string, n int) (*floodJob, error) {
	raw, err := os.ReadFile(config)
	if err != nil {
		return nil, fmt.Errorf("bench flood: %w", err)
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, fmt.Errorf("bench flood: %s: %w", config, err)
	}
	if data, ok := spec["data"].(string); ok && !filepath.IsAbs(data) {
		if spec["data"], err = filepath.Abs(filepath.Join(filepath.Dir(config), data)); err != nil {
			return nil, err
		}
	}
	spec["world_size"], spec["min_world_size"] = n, n // every peer stops after the same step
	job := &floodJob{}
	if b, ok := spec["batch_size"].(float64); ok {
		job.batch = int(b)
	}
	for i := range n {
		pdir := filepath.Join(dir, fmt.Sprintf("peer-%d", i))
		if err := os.MkdirAll(pdir, 0o755); err != nil {
			return nil, err
		}
		spec["checkpoint_dir"] = pdir
		b, _ := json.Marshal(spec)
		cfg := filepath.Join(pdir, "job.json")
		if err := os.WriteFile(cfg, b, 0o644); err != nil {
			return nil, err
		}
		args := []string{"join", "--config", cfg, "--listen", "/ip4/127.0.0.1/tcp/0", "--metrics", "127.0.0.1:0", "--log-format", "json"}
		if i == 0 {
			args = append(args, "--serve", serve)
		} else {
			args = append(args, "--bootstrap", job.peers[0].addr)
		}
		p, dataset, err := startFloodPeer(ctx, exe, pdir, args)
		if err != nil {
			job.kill()
			return nil, err
		}
		p.ckpt = filepath.Join(pdir, spec["name"].(string)+".ckpt")
		p.config = cfg
		if i == 0 {
			job.dataset = dataset
		}
		job.peers = append(job.peers, p)
	}
	return job, nil
}

// startFloodPeer starts one join and reads its stdout until it has said
// where it listens and serves metrics (and what it serves, if it does).
func startFloodPeer(ctx context.Context, exe, dir string, args []string) (*floodPeer, string, error) {
	cmd := exec.Command(exe, args...)
	logf, err := os.Create(filepath.Join(dir, "log.jsonl"))
	if err != nil {
		return nil, "", err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		logf.Close()
		return nil, "", err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, "", err
	}
	p := &floodPeer{cmd: cmd, exited: make(chan error, 1)}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default: // nobody reads any more: the rest is dropped
			}
		}
		close(lines)
		p.exited <- cmd.Wait()
		logf.Close()
	}()
	dataset := ""
	serving := slices.Contains(args, "--serve")
	deadline := time.After(2 * time.Minute)
	for p.addr == "" || p.metrics == "" || serving && dataset == "" {
		select {
		case l, ok := <-lines:
			if !ok {
				return nil, "", fmt.Errorf("bench flood: a peer exited before it said where it listens (log: %s)", filepath.Join(dir, "log.jsonl"))
			}
			switch {
			case strings.HasPrefix(l, "listening on /ip4/127.0.0.1/"):
				p.addr = strings.TrimPrefix(l, "listening on ")
			case strings.HasPrefix(l, "metrics on "):
				p.metrics = strings.TrimPrefix(l, "metrics on ")
			case strings.HasPrefix(l, "serving dataset "):
				dataset = strings.TrimPrefix(l, "serving dataset ")
			}
		case <-deadline:
			cmd.Process.Kill()
			return nil, "", fmt.Errorf("bench flood: a peer said nothing of where it listens in 2 minutes (log: %s)", filepath.Join(dir, "log.jsonl"))
		case <-ctx.Done():
			cmd.Process.Kill()
			return nil, "", ctx.Err()
		}
	}
	go func() {
		for range lines {
		}
	}()
	return p, dataset, nil
}

func (j *floodJob) kill() {
	for _, p := range j.peers {
		p.cmd.Process.Kill()
	}
}

// alive says whether every peer still runs.
func (j *floodJob) alive() error {
	for i, p := range j.peers {
		select {
		case err := <-p.exited:
			p.exited <- err
			return fmt.Errorf("peer %d exited: %v", i, err)
		default:
		}
	}
	return nil
}

// scrape reads a peer's metrics (the few this bench needs).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		name, val, ok := strings.Cut(l, " ")
		if !ok || strings.HasPrefix(l, "#") {
			continue
		}
		switch name {
		case "ringtrain_steps_total", "go_goroutines", "process_resident_memory_bytes", "ringtrain_refused_streams_total", "ringtrain_cut_off_peers_total", "ringtrain_world_size":
			if v, err := strconv.ParseFloat(val, 64); err == nil {
				out[name] = v
			}
		}
	}
	return out, sc.Err()
}

// sample is every peer's metrics at one moment.
type sample struct {
	at  time.Time
	per []map[string]float64
}

func (j *floodJob) sample(ctx context.Context) (sample, error) {
	s := sample{at: time.Now()}
	for i, p := range j.peers {
		m, err := scrape(ctx, p.metrics)
		if err != nil {
			return s, fmt.Errorf("bench flood: peer %d's metrics: %w", i, err)
		}
		s.per = append(s.per, m)
	}
	return s, nil
}

func (s sample) sum(name string) float64 {
	t := 0.0
	for _, m := range s.per {
		t += m[name]
	}
	return t
}

func (s sample) max(name string) float64 {
	t := 0.0
	for _, m := range s.per {
		t = math.Max(t, m[name])
	}
	return t
}

// samplesPerSec is the job's throughput between two samples: every rank
// takes its steps in lockstep, each of a batch.
func (j *floodJob) samplesPerSec(a, b sample) float64 {
	return (b.sum("ringtrain_steps_total") - a.sum("ringtrain_steps_total")) * float64(j.batch) / b.at.Sub(a.at).Seconds()
}

func (j *floodJob) waitTraining(ctx context.Context, within time.Duration) error {
	end := time.Now().Add(within)
	for time.Now().Before(end) {
		if err := j.alive(); err != nil {
			return fmt.Errorf("bench flood: %w", err)
		}
		s, err := j.sample(ctx)
		if err == nil && len(s.per) == len(j.peers) {
			ok := true
			for _, m := range s.per {
				ok = ok && m["ringtrain_steps_total"] > 0
			}
			if ok {
				return nil
			}
		}
		if err := sleepFor(ctx, time.Second); err != nil {
			return err
		}
	}
	return fmt.Errorf("bench flood: the job did not start training within %v", within)
}

func sleepFor(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flood measures a window of baseline, floods the first peer with kind for
// floodFor, and watches the peers' goroutines come back for up to settle.
func (j *floodJob) flood(ctx context.Context, exe string, kind flood.Kind, source string, workers int, baseline, floodFor, settle time.Duration) (floodRow, error) {
	row := floodRow{Kind: kind, BackIn: -1, Seconds: floodFor.Seconds()}
	a, err := j.sample(ctx)
	if err != nil {
		return row, err
	}
	if err := sleepFor(ctx, baseline); err != nil {
		return row, err
	}
	b, err := j.sample(ctx)
	if err != nil {
		return row, err
	}
	row.Baseline = j.samplesPerSec(a, b)
	row.RSSBeforeMB = b.max("process_resident_memory_bytes") / 1e6
	row.GoroutinesWas = int(b.sum("go_goroutines"))
	// nice(1) for the whole process: setpriority on a PID reaches only
	// the thread of that ID, and Go has started others by then.
	cmd := exec.CommandContext(ctx, "nice", "-n", "19", exe, "bench", "flood-peer", "--target", j.peers[0].addr,
		"--kind", string(kind), "--for", floodFor.String(), "--workers", strconv.Itoa(workers), "--from", source, "--dataset", j.dataset,
		"--metrics", strings.TrimSuffix(strings.TrimPrefix(j.peers[0].metrics, "http://"), "/metrics"), "--job-config", j.peers[0].config)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		return row, fmt.Errorf("bench flood: the flooder: %w", err)
	}
	start := time.Now()
	peakG := 0.0
	var rssPeak []float64
	for time.Since(start) < floodFor {
		if err := sleepFor(ctx, min(5*time.Second, floodFor-time.Since(start))); err != nil {
			return row, err
		}
		s, err := j.sample(ctx)
		if err != nil {
			return row, err
		}
		peakG = math.Max(peakG, s.sum("go_goroutines"))
		for i, m := range s.per {
			if len(rssPeak) <= i {
				rssPeak = append(rssPeak, 0)
			}
			rssPeak[i] = math.Max(rssPeak[i], m["process_resident_memory_bytes"])
		}
	}
	c, err := j.sample(ctx)
	if err != nil {
		return row, err
	}
	if err := cmd.Wait(); err != nil {
		return row, fmt.Errorf("bench flood: the flooder: %w: %s", err, errOut.String())
	}
	json.Unmarshal([]byte(out.String()), &row.Stats)
	row.Flooded = j.samplesPerSec(b, c)
	row.Ratio = row.Flooded / row.Baseline
	row.GoroutinesPeak = int(peakG)
	row.Refused = int64(c.sum("ringtrain_refused_streams_total") - b.sum("ringtrain_refused_streams_total"))
	row.CutOff = int64(c.sum("ringtrain_cut_off_peers_total") - b.sum("ringtrain_cut_off_peers_total"))
	for i, m := range b.per {
		row.RSSGrowthMB = math.Max(row.RSSGrowthMB, (rssPeak[i]-m["process_resident_memory_bytes"])/1e6)
	}
	// Goroutines: back to where they were (a few either way: the ring's
	// own come and go) within settle.
	end := time.Now()
	for time.Since(end) < settle {
		s, err := j.sample(ctx)
		if err != nil {
			return row, err
		}
		if g := int(s.sum("go_goroutines")); g <= row.GoroutinesWas+len(j.peers)*2 {
			row.BackIn = math.Round(time.Since(end).Seconds()*10) / 10
			break
		}
		if err := sleepFor(ctx, 250*time.Millisecond); err != nil {
			return row, err
		}
	}
	return row, nil
}

// stop interrupts every peer at once — with min_world_size the job's size,
// they stop after the same step and each writes its checkpoint — and
// returns the SHA-256 of each one's parameters.
func (j *floodJob) stop(ctx context.Context) ([]string, error) {
	for _, p := range j.peers {
		p.cmd.Process.Signal(syscall.SIGINT)
	}
	for i, p := range j.peers {
		select {
		case <-p.exited:
		case <-time.After(2 * time.Minute):
			return nil, fmt.Errorf("bench flood: peer %d did not stop within 2 minutes of Ctrl-C", i)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var hashes []string
	for i, p := range j.peers {
		c, err := train.LoadCheckpoint(p.ckpt)
		if err != nil {
			return nil, fmt.Errorf("bench flood: peer %d's checkpoint: %w", i, err)
		}
		h := sha256.New()
		for _, t := range c.Params {
			for _, v := range t {
				binary.Write(h, binary.LittleEndian, math.Float32bits(v))
			}
		}
		hashes = append(hashes, fmt.Sprintf("%s@%d", hex.EncodeToString(h.Sum(nil))[:16], c.Step))
	}
	return hashes, nil
}

func printFloodTable(w io.Writer, rows []floodRow, one bool, hashes []string) {
	byKind := map[flood.Kind][]floodRow{}
	var order []flood.Kind
	for _, r := range rows {
		if _, ok := byKind[r.Kind]; !ok {
			order = append(order, r.Kind)
		}
		byKind[r.Kind] = append(byKind[r.Kind], r)
	}
	med := func(rs []floodRow, f func(floodRow) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Fprintf(w, "\n| flood | runs | samples/s flooded | before | ratio | sent/s by the flooder | refused | cut off | RSS growth MB | goroutines before → peak | back in s |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, k := range order {
		rs := byKind[k]
		fmt.Fprintf(w, "| %s | %d | %.0f | %.0f | %.2f | %.0f | %.0f | %.0f | %.1f | %.0f → %.0f | %.1f |\n", k, len(rs),
			med(rs, func(r floodRow) float64 { return r.Flooded }), med(rs, func(r floodRow) float64 { return r.Baseline }),
			med(rs, func(r floodRow) float64 { return r.Ratio }),
			med(rs, func(r floodRow) float64 { return float64(r.Stats.Sent+r.Stats.Failed) / r.Seconds }),
			med(rs, func(r floodRow) float64 { return float64(r.Refused) }), med(rs, func(r floodRow) float64 { return float64(r.CutOff) }),
			med(rs, func(r floodRow) float64 { return r.RSSGrowthMB }),
			med(rs, func(r floodRow) float64 { return float64(r.GoroutinesWas) }), med(rs, func(r floodRow) float64 { return float64(r.GoroutinesPeak) }),
			med(rs, func(r floodRow) float64 { return r.BackIn }))
	}
	fmt.Fprintf(w, "\none hash at the end: %v %v\n", one, hashes)
}

// FloodPeer is `ringtrain bench flood-peer`: the hostile peer of bench
// flood, a host of its own that floods --target with --kind for --for and
// prints what it sent as JSON.
//
// jobOf reads a job config into the job its peers know (for the
// formation-lie kind): the ringtrain command's own reading.
func FloodPeer(jobOf func(path string) (p2p.Job, error)) func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runFloodPeer(ctx, args, stdout, stderr, jobOf)
	}
}

func runFloodPeer(ctx context.Context, args []string, stdout, stderr io.Writer, jobOf func(path string) (p2p.Job, error)) error {
	fs := flag.NewFlagSet("bench flood-peer", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("target", "", "the peer to flood, a multiaddr with /p2p/")
	kind := fs.String("kind", "hello", "what to send: "+floodKindNames())
	d := fs.Duration("for", time.Minute, "how long")
	workers := fs.Int("workers", 16, "requests at once")
	from := fs.String("from", "127.0.0.2", "the address to listen and dial from")
	dataset := fs.String("dataset", "", "the served dataset's ID, for --kind data")
	metricsAt := fs.String("metrics", "", "the target's metrics endpoint, host:port, for --kind metrics")
	jobConfig := fs.String("job-config", "", "the target's job config, for --kind formation-lie: what its join command tells anyone")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench flood-peer: %w: %w", cli.ErrUsage, err)
	}
	var job p2p.Job
	if *jobConfig != "" {
		var err error
		if job, err = jobOf(*jobConfig); err != nil {
			return fmt.Errorf("bench flood-peer: %w", err)
		}
	}
	a, err := ma.NewMultiaddr(*target)
	if err != nil {
		return fmt.Errorf("bench flood-peer: --target: %w: %w", err, cli.ErrUsage)
	}
	ai, err := peer.AddrInfoFromP2pAddr(a)
	if err != nil {
		return fmt.Errorf("bench flood-peer: --target: %w: %w", err, cli.ErrUsage)
	}
	h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/" + *from + "/tcp/0"}, Logger: zerolog.Nop()})
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.Connect(ctx, *ai); err != nil {
		return fmt.Errorf("bench flood-peer: %w", err)
	}
	fctx, cancel := context.WithTimeout(ctx, *d)
	defer cancel()
	st, err := flood.Run(fctx, h, *ai, flood.Kind(*kind), flood.Options{Workers: *workers, Dataset: *dataset, Metrics: *metricsAt, Job: job})
	if err != nil {
		return err
	}
	return json.NewEncoder(stdout).Encode(st)
}
