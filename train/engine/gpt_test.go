package engine

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

// tokensOf draws n samples of T tokens below vocab and their next-token
// labels.
func tokensOf(rng *rand.Rand, n, T, vocab int) ([]float32, []int) {
	x, y := make([]float32, n*T), make([]int, n*T)
	for i := range x {
		x[i] = float32(rng.IntN(vocab))
		y[i] = rng.IntN(vocab)
	}
	return x, y
}

// TestNetGPTRefusesTokens: a token that is no whole number inside the
// table is refused before it reaches the device, which would read past
// the table.
func TestNetGPTRefusesTokens(t *testing.T) {
	net, err := New(Host{}, train.ModelConfig{Spec: train.GPTSpec(1, 8, 2, 4), Batch: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	y := make([]int, 4)
	for _, bad := range []float32{256, -1, 1.5, float32(math.NaN())} {
		x := []float32{1, 2, bad, 3}
		if _, err := net.ForwardBackward(x, y, 1); err == nil {
			t.Errorf("token %v: no error", bad)
		}
	}
	if _, err := net.ForwardBackward([]float32{1, 2, 3, 4}, make([]int, 3), 1); err == nil {
		t.Error("3 labels for 4 positions: no error")
	}
	if _, err := net.ForwardBackward([]float32{1, 2, 3, 4}, y, 1); err != nil {
		t.Errorf("a good batch: %v", err)
	}
}

// TestAdamWOnTheDevice: the engine's AdamW — decoupled decay on the
// tensors it names, then Adam — holds train.AdamW's bits step after step,
// with the learning rate changed between steps.
func TestAdamWOnTheDevice(t *testing.T) {
	cfg := train.ModelConfig{Spec: train.GPTSpec(1, 8, 2, 4), Batch: 2, Seed: 2}
	net, err := New(Host{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	ref, err := train.NewModel(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	decay := train.DecayWeights(net.ParamNames())
	if !slices.Contains(decay, true) || !slices.Contains(decay, false) {
		t.Fatalf("decay %v; want some tensors decayed and some not", decay)
	}
	host := train.NewAdamW(1e-2, 0.1, decay)
	dev, err := net.Optimizer(train.NewAdamW(1e-2, 0.1, decay))
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for step := range 3 {
		x, y := tokensOf(rng, 2, 4, train.DefaultVocab)
		if _, err := net.ForwardBackward(x, y, 2); err != nil {
			t.Fatal(err)
		}
		grads := make([][]float32, len(net.Grads()))
		for i, g := range net.Grads() {
			grads[i] = slices.Clone(g)
		}
		dev.Step(net.Params(), grads)
		host.Step(ref.Params(), grads)
		for i, p := range ref.Params() {
			if !slices.Equal(net.Params()[i], p) {
				t.Fatalf("step %d: %s differs from train.AdamW's", step+1, net.ParamNames()[i])
			}
		}
		dev.SetLR(5e-3)
		host.SetLR(5e-3)
	}
	if name, _, _ := dev.State(); name != "adamw" {
		t.Errorf("state named %q; want adamw, as train.AdamW's", name)
	}
}

// trainGPT runs steps of a small GPT with AdamW on ops, through a
// replica on a ring of size, and returns the parameters and the losses.
func trainGPT(t *testing.T, ops Ops, size int, graph bool) ([][]float32, []float32) {
	t.Helper()
	const T, batch = 32, 4
	net, err := New(ops, train.ModelConfig{Spec: train.GPTSpec(2, 64, 4, T), Batch: batch, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer net.Close()
	o, err := net.Optimizer(train.NewAdamW(1e-3, 0.1, train.DecayWeights(net.ParamNames())))
	if err != nil {
		t.Fatal(err)
	}
	net.Graph = graph
	r := train.NewReplica(net, o, ring{size: size})
	rng := rand.New(rand.NewPCG(5, 5))
	var losses []float32
	for s, n := range []int{batch, batch, batch, 3, batch, batch} {
		x, y := tokensOf(rng, n, T, train.DefaultVocab)
		loss, err := r.Step(context.Background(), x, y, n)
		if err != nil {
			t.Fatalf("step %d: %v", s, err)
		}
		losses = append(losses, loss)
	}
	return clone(net.Params()), losses
}

// TestGPTStepsThroughAReplica: the Host GPT with the device AdamW trains
// through a replica, alone (the whole step on the device) and through the
// flat buffer of a ring, to the same bits and finite losses.
func TestGPTStepsThroughAReplica(t *testing.T) {
	alone, lossAlone := trainGPT(t, Host{}, 1, true)
	ringed, lossRinged := trainGPT(t, Host{}, 2, false)
	if !equalParams(alone, ringed) || !slices.Equal(lossAlone, lossRinged) {
		t.Errorf("alone and through the flat buffer differ: losses %v and %v", lossAlone, lossRinged)
	}
	for _, l := range lossAlone {
		if !(l > 0) || math.IsInf(float64(l), 0) {
			t.Fatalf("losses %v", lossAlone)
		}
	}
}
