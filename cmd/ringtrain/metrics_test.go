package main

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
)

// TestMetricsScrape: what the training loop reports is what a scrape of
// /metrics gives, in Prometheus's text format as its own parser reads it.
func TestMetricsScrape(t *testing.T) {
	m := newMetrics()
	m.observe(train.Progress{Epoch: 0, EpochDone: true, TestAccuracy: 0.81, TestLoss: 0.52, WorldSize: 3, SamplesPerSec: 1234,
		Stats: train.ReplicaStats{Steps: 40, Skipped: 1, Reforms: 2, BytesSent: 5000,
			Compute: 3 * time.Second, Wait: time.Second, Ring: 2 * time.Second, Optimizer: 500 * time.Millisecond}}, true)
	m.observe(train.Progress{Epoch: 1, Step: 10, WorldSize: 3, SamplesPerSec: 2000, Stats: train.ReplicaStats{Steps: 50, Compute: 4 * time.Second}}, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, stop, err := m.serve(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("the scrape does not parse: %v", err)
	}
	value := func(name string, labels map[string]string) float64 {
		f, ok := fams[name]
		if !ok {
			t.Fatalf("no %s in the scrape", name)
		}
	next:
		for _, mt := range f.GetMetric() {
			for _, l := range mt.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					continue next
				}
			}
			if c := mt.GetCounter(); c != nil {
				return c.GetValue()
			}
			return mt.GetGauge().GetValue()
		}
		t.Fatalf("no %s%v in the scrape", name, labels)
		return 0
	}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ringtrain_steps_total", nil, 50},
		{"ringtrain_samples_per_second", nil, 2000},
		{"ringtrain_world_size", nil, 3},
		{"ringtrain_epoch", nil, 2},
		{"ringtrain_test_accuracy", nil, 0.81},
		{"ringtrain_test_accuracy_epoch", nil, 1},
		{"ringtrain_test_loss", nil, 0.52},
		{"ringtrain_step_seconds_total", map[string]string{"part": "compute"}, 4},
	} {
		if got := value(c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v; want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := len(fams["ringtrain_step_seconds_total"].GetMetric()); n != 4 {
		t.Errorf("%d parts of the step time; want compute, wait, ring, optimizer", n)
	}
	for _, name := range []string{"ringtrain_skipped_steps_total", "ringtrain_reformations_total", "ringtrain_sent_bytes_total"} {
		value(name, nil)
	}
	// One series, whatever the epochs: a label per epoch grew without
	// bound.
	if n := len(fams["ringtrain_test_accuracy"].GetMetric()); n != 1 {
		t.Errorf("%d series of ringtrain_test_accuracy; want one", n)
	}
}

// TestMetricsServeLibp2p: a host given the metrics' registry puts libp2p's
// series on it — the swarm's and the resource manager's — so that the
// job's /metrics serves them. Before, libp2p registered them on a
// registry nothing served.
func TestMetricsServeLibp2p(t *testing.T) {
	skipShort(t)
	m := newMetrics()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Registerer: m.registerer()})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	other, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: []peer.AddrInfo{{ID: h.ID(), Addrs: h.Addrs()}}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range fams {
		have[f.GetName()] = true
	}
	for _, name := range []string{"libp2p_swarm_connections_opened_total", "libp2p_rcmgr_connections", "libp2p_rcmgr_limit"} {
		if !have[name] {
			t.Errorf("no %s among the %d series families served", name, len(fams))
		}
	}
}

// TestMetricsConnectionsBounded: idle connections to /metrics hold at most
// the server's bound of descriptors, are closed once idle, and a scrape
// still gets through. Before the bound, 20,000 of them took every file
// descriptor of the process.
func TestMetricsConnectionsBounded(t *testing.T) {
	m := newMetrics()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr, stop, err := m.serveBounded(ctx, "127.0.0.1:0", 16, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	fds := func() int {
		es, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Skip("no /proc/self/fd")
		}
		return len(es)
	}
	before := fds()
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	// From 127.0.0.2, as a stranger's would come from elsewhere.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	for range 200 {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			break
		}
		idle = append(idle, c)
	}
	time.Sleep(100 * time.Millisecond) // for the server to accept what it will
	// Each idle connection is a descriptor of this test's own; the
	// server's are what is over that.
	if server := fds() - before - len(idle); server > metricsPerIP+2 {
		t.Errorf("200 idle connections from one address hold %d of the server's descriptors; want at most %d", server, metricsPerIP)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("a scrape behind 200 idle connections: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("scrape: %s", resp.Status)
	}
}

// TestMetricsAddrIsLoopback: an address without a host is served on
// loopback; one that names a host, as named.
func TestMetricsAddrIsLoopback(t *testing.T) {
	for in, want := range map[string]string{"9100": "127.0.0.1:9100", ":9100": "127.0.0.1:9100", "0.0.0.0:9100": "0.0.0.0:9100", "[::1]:0": "[::1]:0"} {
		if got := metricsAddr(in); got != want {
			t.Errorf("metricsAddr(%q) = %q; want %q", in, got, want)
		}
	}
}
