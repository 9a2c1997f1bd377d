package main

import (
	"errors"
	"fmt"

	"github.com/ringtrain/ringtrain/train"
	"github.com/ringtrain/ringtrain/train/engine"
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

// newModel builds cfg's model on a device.
func newModel(device string, cfg train.ModelConfig) (train.Model, error) {
	switch device {
	case "", "cpu":
		return train.NewModel(cfg)
	case "host":
		return engine.New(engine.Host{}, cfg)
	case "cuda":
		ops, err := newCUDA()
		if err != nil {
			return nil, fmt.Errorf("--device cuda: %w", err)
		}
		return engine.New(ops, cfg)
	}
	return nil, fmt.Errorf("device %q; want cpu, cuda or host: %w", device, errUsage)
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
