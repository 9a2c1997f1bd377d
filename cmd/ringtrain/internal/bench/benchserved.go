package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
)

// servedRun is one run of bench served.
type servedRun struct {
	Run int `json:"run"`
	// FetchPerSec is samples/s the served path delivers: a fresh client
	// fetching the whole train split in a shuffled order, checked.
	FetchPerSec float64 `json:"fetch_samples_per_s"`
	// LoaderPerSec and LocalPerSec are one loader epoch (transforms and
	// batches of 64, one rank) on served data, fetched as it goes, and on
	// local files.
	LoaderPerSec float64 `json:"served_loader_samples_per_s"`
	LocalPerSec  float64 `json:"local_loader_samples_per_s"`
}

// Served is `ringtrain bench served`: a data server and a client
// in this process, on loopback, as two peers of one machine would be.
func Served(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench served", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataConfig := fs.String("data", "testdata/fashion-mnist-full.json", "data config of the dataset to serve")
	requestSize := fs.Int("request-size", 256, "samples per request")
	ahead := fs.Int("ahead", 8, "requests in flight")
	runs := fs.Int("runs", 5, "runs; the medians are reported")
	if err := cli.ParseFlags(fs, args); err != nil {
		return fmt.Errorf("bench served: %w: %w", cli.ErrUsage, err)
	}
	server, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}})
	if err != nil {
		return err
	}
	defer server.Close()
	served, err := serve(server, *dataConfig)
	if err != nil {
		return err
	}
	defer served.srv.Close()
	boot := []peer.AddrInfo{{ID: server.ID(), Addrs: server.Addrs()}}
	rc := data.RemoteConfig{RequestSize: *requestSize, Ahead: *ahead}
	var all []servedRun
	enc := json.NewEncoder(stdout)
	for r := range *runs {
		run := servedRun{Run: r + 1}
		// Fetch: the whole split, in an epoch's order.
		order := rand.New(rand.NewPCG(uint64(r), 1)).Perm(served.train.Len())
		secs, err := servedEpoch(ctx, boot, served.m.ID(), rc, func(s *data.Split) error { return s.Prefetch(ctx, order) })
		if err != nil {
			return err
		}
		run.FetchPerSec = float64(len(order)) / secs
		loader := func(s *data.Split) error {
			l := &data.Loader{Split: s, BatchSize: 64, Seed: uint64(r), Sampler: data.Sampler{N: s.Len(), World: 1, Seed: uint64(r), Shuffle: true}}
			e, err := l.Epoch(ctx, 0)
			if err != nil {
				return err
			}
			defer e.Close()
			return e.Each(func(*data.Batch) error { return nil })
		}
		if secs, err = servedEpoch(ctx, boot, served.m.ID(), rc, loader); err != nil {
			return err
		}
		run.LoaderPerSec = float64(served.train.Len()) / secs
		start := time.Now()
		if err := loader(served.train); err != nil {
			return err
		}
		run.LocalPerSec = float64(served.train.Len()) / time.Since(start).Seconds()
		all = append(all, run)
		if err := enc.Encode(run); err != nil {
			return err
		}
	}
	med := func(f func(servedRun) float64) float64 {
		v := make([]float64, len(all))
		for i, r := range all {
			v[i] = f(r)
		}
		return median(v)
	}
	return enc.Encode(map[string]any{"summary": "medians", "runs": len(all), "request_size": *requestSize, "ahead": *ahead,
		"samples": served.train.Len(), "sample_bytes": served.m.Splits[0].Samples[0].Size(),
		"fetch_samples_per_s":         med(func(r servedRun) float64 { return r.FetchPerSec }),
		"served_loader_samples_per_s": med(func(r servedRun) float64 { return r.LoaderPerSec }),
		"local_loader_samples_per_s":  med(func(r servedRun) float64 { return r.LocalPerSec }),
		"served_over_local_loader":    med(func(r servedRun) float64 { return r.LoaderPerSec / r.LocalPerSec }),
	})
}

// servedEpoch times f on the train split of a fresh client of the
// dataset: nothing is here when it starts.
func servedEpoch(ctx context.Context, boot []peer.AddrInfo, id string, rc data.RemoteConfig, f func(*data.Split) error) (float64, error) {
	h, err := p2p.NewHost(ctx, p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}, Bootstrap: boot})
	if err != nil {
		return 0, err
	}
	defer h.Close()
	c, err := p2p.OpenServedData(ctx, h, id, p2p.DataClientConfig{})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	s, err := c.Manifest().Remote("train", c, rc)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	start := time.Now()
	if err := f(s); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}

// served is a data config's training split served on a host.
type served struct {
	m     *data.Manifest
	train *data.Split
	srv   *p2p.DataServer
}

// serve serves the training split of the data config at path on h, as
// `ringtrain serve` would, without its words.
func serve(h *p2p.Host, path string) (*served, error) {
	cfg, err := data.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	s := &served{}
	if s.train, err = cfg.Load("train"); err != nil {
		return nil, err
	}
	if s.m, err = data.NewManifest(cfg, s.train.Dataset, nil); err != nil {
		return nil, err
	}
	s.srv = p2p.NewDataServer(h, p2p.DataServerConfig{Logger: zerolog.Nop()})
	if err := s.srv.Serve(s.m, s.train.Dataset); err != nil {
		s.srv.Close()
		return nil, err
	}
	return s, nil
}
