package main

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// metrics are a peer's training figures for Prometheus (join --metrics
// ADDR): where step time goes, samples/s, bytes sent, skipped steps,
// re-formations, world size and test accuracy per epoch. The training loop
// hands it its progress reports; a scrape reads the latest under a lock.
type metrics struct {
	reg *prometheus.Registry
	// One series each, the epoch a value: a label per epoch grew the
	// series without bound over a long job.
	acc, accEpoch, testLoss prometheus.Gauge
	dropped                 prometheus.Counter // peers dropped for lying

	mu   sync.Mutex
	last train.Progress
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	read := func(f func(p train.Progress) float64) func() float64 {
		return func() float64 {
			m.mu.Lock()
			defer m.mu.Unlock()
			return f(m.last)
		}
	}
	part := func(name string, f func(s train.ReplicaStats) time.Duration) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringtrain_step_seconds_total",
			Help:        "Seconds of training steps, by part: compute (forward and backward), wait (in the allreduce until the other ranks reached it), ring (the rest of the allreduce), optimizer.",
			ConstLabels: prometheus.Labels{"part": name}},
			read(func(p train.Progress) float64 { return f(p.Stats).Seconds() }))
	}
	counter := func(name, help string, f func(p train.Progress) float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, read(f))
	}
	gauge := func(name, help string, f func(p train.Progress) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, read(f))
	}
	m.acc = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringtrain_test_accuracy",
		Help: "Test accuracy after the last epoch done (the whole test set, scored over the ring)."})
	m.accEpoch = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringtrain_test_accuracy_epoch",
		Help: "The epoch (1-based) ringtrain_test_accuracy was scored after; 0 before the first."})
	m.testLoss = prometheus.NewGauge(prometheus.GaugeOpts{Name: "ringtrain_test_loss",
		Help: "Mean test loss after the last epoch done (a language model's: its validation loss per byte, in nats; ÷ ln 2 for bits per byte)."})
	m.dropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "ringtrain_dropped_liars_total",
		Help: "Peers this peer's ring dropped for telling the others what no honest replica could (a desync named)."})
	m.reg.MustRegister(
		part("compute", func(s train.ReplicaStats) time.Duration { return s.Compute }),
		part("wait", func(s train.ReplicaStats) time.Duration { return s.Wait }),
		part("ring", func(s train.ReplicaStats) time.Duration { return s.Ring }),
		part("optimizer", func(s train.ReplicaStats) time.Duration { return s.Optimizer }),
		counter("ringtrain_steps_total", "Training steps run, applied or skipped.", func(p train.Progress) float64 { return float64(p.Stats.Steps) }),
		counter("ringtrain_skipped_steps_total", "Steps skipped on every rank for NaN or Inf gradients.", func(p train.Progress) float64 { return float64(p.Stats.Skipped) }),
		counter("ringtrain_reformations_total", "Times the ring re-formed under this peer.", func(p train.Progress) float64 { return float64(p.Stats.Reforms) }),
		counter("ringtrain_sent_bytes_total", "Gradient bytes this peer sent in allreduces.", func(p train.Progress) float64 { return float64(p.Stats.BytesSent) }),
		gauge("ringtrain_samples_per_second", "This peer's training samples per second since its epoch began.", func(p train.Progress) float64 { return p.SamplesPerSec }),
		gauge("ringtrain_world_size", "Peers in the ring.", func(p train.Progress) float64 { return float64(p.WorldSize) }),
		gauge("ringtrain_epoch", "The epoch under way (1-based), or the last one done.", func(p train.Progress) float64 { return float64(p.Epoch + 1) }),
		m.acc, m.accEpoch, m.testLoss, m.dropped,
		// The Go runtime's and the process's own (goroutines, memory,
		// CPU seconds), as every Go exporter serves them.
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// registerer is where libp2p registers its series, or nil without
// metrics.
func (m *metrics) registerer() prometheus.Registerer {
	if m == nil {
		return nil
	}
	return m.reg
}

// guard adds the host's guard's counts: streams refused and peers cut off.
func (m *metrics) guard(g *p2p.Guard) {
	m.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringtrain_refused_streams_total",
			Help: "Streams other peers opened that this peer's limits refused."}, func() float64 { return float64(g.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "ringtrain_cut_off_peers_total",
			Help: "Peers cut off for breaking this peer's limits or sending what does not decode."}, func() float64 { return float64(g.Bans()) }),
	)
}

// droppedLiars counts peers dropped for lying (elastic.Job's Dropped).
func (m *metrics) droppedLiars(peers []string, _ string) { m.dropped.Add(float64(len(peers))) }

// observe takes a progress report; it runs on the training goroutine.
func (m *metrics) observe(p train.Progress, hasTest bool) {
	if p.Validation { // between epochs: the test set's figures alone
		m.acc.Set(p.TestAccuracy)
		m.testLoss.Set(p.TestLoss)
		return
	}
	m.mu.Lock()
	m.last = p
	m.mu.Unlock()
	if p.EpochDone && hasTest {
		m.acc.Set(p.TestAccuracy)
		m.testLoss.Set(p.TestLoss)
		m.accEpoch.Set(float64(p.Epoch + 1))
	}
}

// Bounds of the metrics server: a scraper opens one connection every few
// seconds, and 20,000 idle keep-alive connections once took every file
// descriptor the process had (a partner peer's join then timed out).
const (
	metricsMaxConns = 64
	metricsPerIP    = 8
	metricsIdle     = 30 * time.Second
)

// boundedListener closes at once what it accepts over maxConns at once,
// or over perIP from one address — so that a flood neither takes the
// process's descriptors nor queues ahead of a scraper from elsewhere (a
// listener that blocks at its bound, as x/net's LimitListener does, left
// the scrape waiting behind the flood).
type boundedListener struct {
	net.Listener
	maxConns, perIP int

	mu    sync.Mutex
	total int
	byIP  map[string]int
}

func (l *boundedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := c.RemoteAddr().String()
		if host, _, err := net.SplitHostPort(ip); err == nil {
			ip = host
		}
		l.mu.Lock()
		ok := l.total < l.maxConns && l.byIP[ip] < l.perIP
		if ok {
			l.total++
			l.byIP[ip]++
		}
		l.mu.Unlock()
		if !ok {
			c.Close()
			continue
		}
		return &boundedConn{Conn: c, release: func() {
			l.mu.Lock()
			l.total--
			if l.byIP[ip]--; l.byIP[ip] == 0 {
				delete(l.byIP, ip)
			}
			l.mu.Unlock()
		}}, nil
	}
}

type boundedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *boundedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// metricsAddr is where --metrics listens: on loopback unless the address
// names a host ("9100" and ":9100" are 127.0.0.1:9100; "0.0.0.0:9100"
// serves every interface, as asked).
func metricsAddr(addr string) string {
	if _, err := strconv.Atoi(addr); err == nil {
		return net.JoinHostPort("127.0.0.1", addr)
	}
	if host, port, err := net.SplitHostPort(addr); err == nil && host == "" {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return addr
}

// serve serves /metrics on addr until ctx ends or stop is called, and
// returns the address it listens on (addr may ask for port 0).
func (m *metrics) serve(ctx context.Context, addr string) (bound string, stop func(), err error) {
	return m.serveBounded(ctx, addr, metricsMaxConns, metricsIdle)
}

// serveBounded is serve with at most maxConns connections at once,
// metricsPerIP from one address (the rest closed as they come), and idle
// ones closed after idle.
func (m *metrics) serveBounded(ctx context.Context, addr string, maxConns int, idle time.Duration) (bound string, stop func(), err error) {
	raw, err := net.Listen("tcp", metricsAddr(addr))
	if err != nil {
		return "", nil, err
	}
	ln := &boundedListener{Listener: raw, maxConns: maxConns, perIP: min(metricsPerIP, maxConns), byIP: map[string]int{}}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: min(10*time.Second, idle), ReadTimeout: min(10*time.Second, idle), WriteTimeout: 30 * time.Second,
		IdleTimeout: idle, MaxHeaderBytes: 16 << 10, BaseContext: func(net.Listener) context.Context { return ctx }}
	var wg sync.WaitGroup
	// Serve returns http.ErrServerClosed once stopped; the listener is
	// ours and fails only with it.
	wg.Go(func() { srv.Serve(ln) })
	stopped := context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr().String(), func() {
		stopped()
		srv.Close()
		wg.Wait()
	}, nil
}
