// Package devices is what computes a model's gradients, as the command
// line picks it: the gorgonia graph on the CPU, ringtrain's engine on an
// NVIDIA GPU (in the CUDA build only), or that engine in pure Go, its
// reference.
package devices

import (
	"errors"
	"flag"
	"fmt"

	"github.com/ringtrain/ringtrain/cmd/ringtrain/internal/cli"
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
const Help = "what computes the gradients: cpu (gorgonia), cuda (the CUDA build's GPU engine) or host (that engine in pure Go, its reference)"

// ErrNoCUDA is what asking a build without CUDA for the GPU gets.
var ErrNoCUDA = errors.New("this ringtrain was built without CUDA: build the CUDA one with `make cuda` and run bin/ringtrain-cuda, on a machine with an NVIDIA GPU and driver")

// Options are the engine's settings from the command line.
type Options struct {
	// TF32 lets cuBLAS use TF32 tensor cores (cuda only).
	TF32 bool
	// NoGraph turns off replaying a captured step (CUDA graphs).
	NoGraph bool
	// ConvAlgos is which of cuDNN's convolution algorithms the engine may
	// take (cuda only): "exact" (the default) or "any".
	ConvAlgos string
	// HostThreads, if above 0, is the thread budget of the host engine's
	// or the CPU model's matrix products (join sets it to leave the ring
	// a thread of its own).
	HostThreads int
}

// AddFlags defines the engine's flags on fs.
func AddFlags(fs *flag.FlagSet) *Options {
	var o Options
	fs.BoolVar(&o.TF32, "tf32", false, "cuda: let cuBLAS and cuDNN multiply in TF32 on tensor cores (faster; errors near 1e-3 instead of 1e-7)")
	fs.BoolVar(&o.NoGraph, "no-graph", false, "cuda and host: run every step call by call instead of replaying a captured one (CUDA graph)")
	o.ConvAlgos = "exact"
	fs.Func("conv-algos", "cuda: cuDNN's convolution algorithms the engine may take: exact (the default; deterministic, summing as a GEMM does: "+
		"the same bits every run) or any (the fastest, FFT, Winograd and atomics included, as PyTorch's defaults)", func(v string) error {
		if _, err := engine.ConvAlgos(v); err != nil {
			return err
		}
		o.ConvAlgos = v
		return nil
	})
	return &o
}

// Args gives the options back as flags, for local's peers.
func (o Options) Args() []string {
	var a []string
	if o.TF32 {
		a = append(a, "--tf32")
	}
	if o.NoGraph {
		a = append(a, "--no-graph")
	}
	if o.ConvAlgos != "" && o.ConvAlgos != "exact" {
		a = append(a, "--conv-algos", o.ConvAlgos)
	}
	return a
}

// NewModel builds cfg's model on a device.
func NewModel(device string, cfg train.ModelConfig, opt Options) (train.Model, error) {
	anyAlgo, err := engine.ConvAlgos(opt.ConvAlgos)
	if err != nil {
		return nil, fmt.Errorf("--conv-algos: %w: %w", cli.ErrUsage, err)
	}
	switch device {
	case "", "cpu":
		cfg.Threads = opt.HostThreads
		return train.NewModel(cfg)
	case "host":
		var h engine.Host
		if opt.HostThreads > 0 {
			h.BLAS = gemm.New(opt.HostThreads)
		}
		return engine.New(h, cfg)
	case "cuda":
		ops, err := newCUDA(engine.CUDAOptions{TF32: opt.TF32, AnyConvAlgo: anyAlgo})
		if err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		return engine.New(ops, cfg)
	}
	return nil, fmt.Errorf("device %q; want cpu, cuda or host: %w", device, cli.ErrUsage)
}

// BindOptimizer moves opt onto the model's device when the model lives on
// one (the engine's nets), so that parameters and optimizer state stay
// there; a gorgonia model keeps opt on the host.
func BindOptimizer(m train.Model, opt train.Optimizer, o Options) (train.Optimizer, error) {
	net, ok := m.(*engine.Net)
	if !ok {
		return opt, nil
	}
	net.Graph = !o.NoGraph
	return net.Optimizer(opt)
}

// Of reconciles --device with the config's gpus: gpus 1 asks for
// cuda, as it did in the tools this replaces; a peer drives one GPU.
func Of(flagDevice string, gpus int) (string, error) {
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
