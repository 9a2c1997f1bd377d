package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/p2p"
	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/elastic"
)

// vanishing is a replica whose whole host goes away after its n-th
// backward pass: its neighbours are in the step's allreduce, and its libp2p
// connections drop under their feet.
type vanishing struct {
	train.Model
	n    int
	gone func()
}

func (v *vanishing) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	loss, err := v.Model.ForwardBackward(x, y, n)
	if v.n--; v.n == 0 {
		v.gone()
	}
	return loss, err
}

// loopbackPeers starts n hosts on 127.0.0.1, each but the first given
// only the first one's address, each with a node of job; they are closed
// when the test ends.
func loopbackPeers(ctx context.Context, t *testing.T, n int, job p2p.Job) ([]*p2p.Host, []*p2p.Node) {
	t.Helper()
	var hosts []*p2p.Host
	var nodes []*p2p.Node
	for i := range n {
		cfg := p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}}
		}
		h, err := p2p.NewHost(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		node, err := p2p.NewNode(h, job, p2p.NodeConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(node.Close)
		hosts, nodes = append(hosts, h), append(nodes, node)
	}
	return hosts, nodes
}

// TestSurvivorsFinishOverLibp2p runs what `ringtrain join` runs — an
// elastic.Job over p2p.Membership — on four libp2p hosts in this process:
// one host vanishes in the middle of a step; the other three re-form
// through p2p (Reform, new links) and finish training with the same
// parameters.
func TestSurvivorsFinishOverLibp2p(t *testing.T) {
	const world, batch = 4, 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hosts, nodes := loopbackPeers(ctx, t, world, p2p.Job{Name: "elastic-libp2p", ConfigHash: "x", WorldSize: world})
	cfgData, err := data.LoadConfig("../../testdata/data-config.json")
	if err != nil {
		t.Fatal(err)
	}
	split, err := cfgData.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	sums := make([]train.Summary, world)
	errs := make([]error, world)
	outs := make([]bytes.Buffer, world)
	var wg sync.WaitGroup
	for i := range world {
		links := p2p.NewRingLinks(hosts[i], nodes[i], p2p.LinksConfig{Logger: zerolog.Nop()})
		defer links.Close()
		wg.Go(func() {
			m, err := train.NewModel(train.ModelConfig{Spec: train.MLPSpec(784, []int{16}, 10), Batch: batch, Seed: 1})
			if err != nil {
				errs[i] = err
				return
			}
			defer m.Close()
			var model train.Model = m
			if i == 2 {
				model = &vanishing{Model: m, n: 7, gone: func() { links.Close(); nodes[i].Close(); hosts[i].Close() }}
			}
			job := &elastic.Job{
				Members:   p2p.NewMembership(nodes[i], links, 20*time.Second),
				WorldSize: world, MinWorldSize: 3, StepTimeout: 10 * time.Second, Out: &outs[i],
				Training: train.RunConfig{
					Replica: train.NewReplica(model, &train.SGD{LR: 0.05, Momentum: 0.9}, nil),
					Train: &data.Loader{Split: split, BatchSize: batch, Seed: 1,
						Sampler: data.Sampler{N: split.Len(), World: 1, Seed: 1, Shuffle: true}},
					Epochs: 2, Classes: 10,
				},
			}
			sums[i], errs[i] = job.Run(ctx)
		})
	}
	wg.Wait()
	if errs[2] == nil {
		t.Error("the vanished host's run ended without an error")
	}
	for _, i := range []int{0, 1, 3} {
		if errs[i] != nil {
			t.Fatalf("survivor %d: %v", i, errs[i])
		}
		if !strings.Contains(outs[i].String(), "ring re-formed: rank") || !strings.Contains(outs[i].String(), "of 3, generation 2, 1 peer(s) lost") {
			t.Errorf("survivor %d says %q; want the ring re-formed as 3 in generation 2", i, outs[i].String())
		}
		if sums[i].Epochs != 2 || sums[i].ParamHash != sums[0].ParamHash {
			t.Errorf("survivor %d: %d epochs, hash %.16s; want 2 and survivor 0's %.16s", i, sums[i].Epochs, sums[i].ParamHash, sums[0].ParamHash)
		}
	}
	if errors.Is(errs[0], elastic.ErrReformBudget) {
		t.Error("the survivors ran out of re-formations")
	}
}
