package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/engine"
	"github.com/ringtrain/ringtrain/train/gemm"
)

// Devices a model can compute on:
//   - cpu: the gorgonia graph (the default);
//   - cuda: ringtrain's own engine on an NVIDIA GPU, in the CUDA build only
//     (make cuda → bin/ringtrain-cuda);
//   - host: that same engine on the CPU in pure Go — the CUDA engine's
//     reference, slower than cpu, for checking the engine anywhere.
const deviceHelp = "what computes the gradients: cpu (gorgonia), cuda (the CUDA build's GPU engine) or host (that engine in pure Go, its reference)"

// errNoCUDA is what asking a build without CUDA for the GPU gets.
var errNoCUDA = errors.New("this ringtrain was built without CUDA: build the CUDA one with `make cuda` and run bin/ringtrain-cuda, on a machine with an NVIDIA GPU and driver")

// deviceOptions are the engine's settings from the command line.
type deviceOptions struct {
	// TF32 lets cuBLAS use TF32 tensor cores (cuda only).
	TF32 bool
	// NoGraph turns off replaying a captured step (CUDA graphs).
	NoGraph bool
	// hostThreads, if above 0, is the thread budget of the host engine's
	// or the CPU model's matrix products (join sets it to leave the ring
	// a thread of its own).
	hostThreads int
}

// addDeviceFlags defines the engine's flags on fs.
func addDeviceFlags(fs *flag.FlagSet) *deviceOptions {
	var o deviceOptions
	fs.BoolVar(&o.TF32, "tf32", false, "cuda: let cuBLAS multiply in TF32 on tensor cores (faster; GEMM errors near 1e-3 instead of 1e-7)")
	fs.BoolVar(&o.NoGraph, "no-graph", false, "cuda and host: run every step call by call instead of replaying a captured one (CUDA graph)")
	return &o
}

// args gives the options back as flags, for local's peers.
func (o deviceOptions) args() []string {
	var a []string
	if o.TF32 {
		a = append(a, "--tf32")
	}
	if o.NoGraph {
		a = append(a, "--no-graph")
	}
	return a
}

// newModel builds cfg's model on a device.
func newModel(device string, cfg train.ModelConfig, opt deviceOptions) (train.Model, error) {
	switch device {
	case "", "cpu":
		cfg.Threads = opt.hostThreads
		return train.NewModel(cfg)
	case "host":
		var h engine.Host
		if opt.hostThreads > 0 {
			h.BLAS = gemm.New(opt.hostThreads)
		}
		return engine.New(h, cfg)
	case "cuda":
		ops, err := newCUDA(engine.CUDAOptions{TF32: opt.TF32})
		if err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		return engine.New(ops, cfg)
	}
	return nil, fmt.Errorf("device %q; want cpu, cuda or host: %w", device, errUsage)
}

// bindOptimizer moves opt onto the model's device when the model lives on
// one (the engine's nets), so that parameters and optimizer state stay
// there; a gorgonia model keeps opt on the host.
func bindOptimizer(m train.Model, opt train.Optimizer, o deviceOptions) (train.Optimizer, error) {
	net, ok := m.(*engine.Net)
	if !ok {
		return opt, nil
	}
	net.Graph = !o.NoGraph
	return net.Optimizer(opt)
}

// deviceOf reconciles --device with the config's gpus: gpus 1 asks for
// cuda, as it did in the tools this replaces; a peer drives one GPU.
func deviceOf(flagDevice string, gpus int) (string, error) {
	switch {
	case gpus > 1:
		return "", fmt.Errorf("gpus %d: a peer drives one GPU; start one peer per GPU (ringtrain local -n, or one join each)", gpus)
	case gpus == 1 && flagDevice == "":
		return "cuda", nil
	case flagDevice == "":
		return "cpu", nil
	}
	return flagDevice, nil
}
