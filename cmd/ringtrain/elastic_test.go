package main

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// vanishing is a rank whose whole host goes away in the middle of its n-th
// allreduce: its libp2p connections drop under the neighbours' feet.
type vanishing struct {
	train.Collective
	n    int
	gone func()
}

var errVanished = errors.New("vanished")

func (v *vanishing) AllreduceMean(ctx context.Context, buf []float32) error {
	if v.n--; v.n == 0 {
		v.gone()
		return errVanished
	}
	return v.Collective.AllreduceMean(ctx, buf)
}

// TestSurvivorsFinishOverLibp2p is TestSurvivorsFinish of package train
// over real libp2p hosts in this process: one of four hosts vanishes in the
// middle of an allreduce; the other three re-form through p2p (Reform,
// new links) and finish training with the same parameters.
func TestSurvivorsFinishOverLibp2p(t *testing.T) {
	const world, batch = 4, 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := p2p.StartLocalSwarm(ctx, world, p2p.Job{Name: "elastic-libp2p", ConfigHash: "x", WorldSize: world})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	links := make([]*p2p.RingLinks, world)
	for i, h := range s.Hosts {
		links[i] = p2p.NewRingLinks(h, s.Nodes[i], p2p.LinksConfig{Logger: zerolog.Nop()})
		defer links[i].Close()
	}
	if err := s.Join(ctx); err != nil {
		t.Fatal(err)
	}
	cfgData, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	split, err := cfgData.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	connect := func(i int, f *p2p.Formation) (*ring.Ring, error) {
		tr, err := links[i].Connect(ctx, f)
		if err != nil {
			return nil, err
		}
		return ring.New(tr, ring.Config{Rank: f.Rank, Size: len(f.Members), Generation: f.Generation})
	}
	sums := make([]train.Summary, world)
	errs := make([]error, world)
	var wg sync.WaitGroup
	for i := range world {
		wg.Go(func() {
			f := s.Formations[i]
			rg, err := connect(i, f)
			if err != nil {
				errs[i] = err
				return
			}
			defer func() { rg.Close() }()
			var coll train.Collective = rg
			if i == 2 {
				coll = &vanishing{Collective: rg, n: 7, gone: func() { rg.Close(); s.Nodes[i].Close(); s.Hosts[i].Close() }}
			}
			m, err := train.NewModel(train.ModelConfig{Spec: train.MLPSpec(784, []int{16}, 10), Batch: batch, Seed: 1})
			if err != nil {
				errs[i] = err
				return
			}
			defer m.Close()
			sums[i], errs[i] = train.Run(ctx, train.RunConfig{
				Replica: train.NewReplica(m, &train.SGD{LR: 0.05, Momentum: 0.9}, coll),
				Train: &data.Loader{Split: split, BatchSize: batch, Seed: 1,
					Sampler: data.Sampler{N: split.Len(), World: world, Rank: f.Rank, Seed: 1, Shuffle: true}},
				Epochs: 2, Classes: 10, MinSize: 3,
				Reform: func(ctx context.Context, cause error, at train.Position) (train.Collective, error) {
					if i == 2 {
						return nil, errVanished
					}
					rg.Close()
					next, err := s.Nodes[i].Reform(ctx, f, 3)
					if err != nil {
						return nil, err
					}
					f = next
					if rg, err = connect(i, f); err != nil {
						return nil, err
					}
					return rg, nil
				},
			})
		})
	}
	wg.Wait()
	if !errors.Is(errs[2], errVanished) {
		t.Errorf("the vanished host's run: %v", errs[2])
	}
	for _, i := range []int{0, 1, 3} {
		if errs[i] != nil {
			t.Fatalf("survivor %d: %v", i, errs[i])
		}
		if sums[i].Epochs != 2 || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("survivor %d: %d epochs, hash %.16s; want 2 and survivor 0's %.16s", i, sums[i].Epochs, sums[i].ParamHash, sums[0].ParamHash)
		}
	}
}
