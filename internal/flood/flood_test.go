package flood

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
)

var job = p2p.Job{Name: "test-job", ConfigHash: strings.Repeat("ab", 32), WorldSize: 8}

func host(t *testing.T, cfg p2p.HostConfig) *p2p.Host {
	t.Helper()
	cfg.Listen = []string{"/ip4/127.0.0.1/tcp/0"}
	h, err := p2p.NewHost(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// served serves testdata's dataset on h and returns its ID.
func served(t *testing.T, h *p2p.Host) string {
	t.Helper()
	c, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	tr, err := c.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	te, err := c.Load("test")
	if err != nil {
		t.Fatal(err)
	}
	m, err := data.NewManifest(c, tr.Dataset, te.Dataset)
	if err != nil {
		t.Fatal(err)
	}
	s := p2p.NewDataServer(h, p2p.DataServerConfig{})
	t.Cleanup(s.Close)
	if err := s.Serve(m, tr.Dataset, te.Dataset); err != nil {
		t.Fatal(err)
	}
	return m.ID()
}

// TestEveryFloodIsCutOff: the flood benchmark's hostile peer, each kind
// against a peer with every ringtrain handler (hello, re-formation,
// admission, ring links, job config, served data): each flood that breaks
// a limit or sends what does not decode gets the flooder cut off, and one
// that asks only for what a peer may (valid data requests) is served, not
// cut off. A stranger gets no relay, and a liar that knows the job is cut
// off, no member to the guard.
func TestEveryFloodIsCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("takes seconds; make test runs it")
	}
	for _, kind := range Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			if kind == Metrics {
				t.Skip("the metrics server is cmd/ringtrain's: TestMetricsConnectionsBounded")
			}
			victim := host(t, p2p.HostConfig{})
			// Low limits, so that even a flooder slowed by the race
			// detector breaks them within the flood.
			victim.Guard.SetLimits(p2p.Limits{Strikes: 10, Burst: 5, RequestsPerSecond: 5})
			n, err := p2p.NewNode(victim, job, p2p.NodeConfig{})
			if err != nil {
				t.Fatal(err)
			}
			defer n.Close()
			links := p2p.NewRingLinks(victim.Host, n, p2p.LinksConfig{})
			defer links.Close()
			defer p2p.ServeJobConfig(victim, job.Name, job.ConfigHash, []byte("{}"), zerolog.Nop())()
			dataset := served(t, victim)
			flooder := host(t, p2p.HostConfig{Bootstrap: []peer.AddrInfo{{ID: victim.ID(), Addrs: victim.Addrs()}}})
			st, err := floodUntilCut(t, victim, flooder, kind, Options{Workers: 4, Dataset: dataset, Job: job})
			if err != nil {
				t.Fatal(err)
			}
			cut := victim.Guard.Banned(flooder.ID())
			switch kind {
			case Data:
				if cut || st.Answered == 0 {
					t.Errorf("valid data requests: cut off %v, %d answered; want served (%+v)", cut, st.Answered, st)
				}
			case DHT:
				// Lookups ride one stream per peer: not refused, not cut off;
				// libp2p's own limits bound them.
			case Relay:
				if st.Sent > 0 {
					t.Errorf("a stranger got %d relay reservations or circuits (%+v)", st.Sent, st)
				}
			case Formation:
				// The liar proves the job, but once it proposed what no
				// honest peer could it is no member to the guard.
				if !cut || n.Verified(flooder.ID()) {
					t.Errorf("after the liar's hellos: cut off %v, trusted %v; want cut off, not trusted (%+v)", cut, n.Verified(flooder.ID()), st)
				}
			default:
				if !cut {
					t.Errorf("the %s flooder is not cut off (%+v, %d streams refused)", kind, st, victim.Guard.Refused())
				}
			}
		})
	}
}

// floodUntilCut floods victim for 1.5 s, or, for a kind that must be cut
// off, until it is (at most 10 s): on a loaded machine the flooder and the
// victim may take longer than a second or two to break the limits, and
// the test is of the cut-off, not of how soon it comes (make bench-flood
// times that).
func floodUntilCut(t *testing.T, victim, flooder *p2p.Host, kind Kind, opt Options) (Stats, error) {
	t.Helper()
	window := 1500 * time.Millisecond
	mustCut := kind != Data && kind != DHT && kind != Relay
	if mustCut {
		window = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	if mustCut {
		watched := make(chan struct{})
		defer func() { cancel(); <-watched }()
		go func() {
			defer close(watched)
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for !victim.Guard.Banned(flooder.ID()) {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
			cancel()
		}()
	}
	return Run(ctx, flooder, peer.AddrInfo{ID: victim.ID(), Addrs: victim.Addrs()}, kind, opt)
}
