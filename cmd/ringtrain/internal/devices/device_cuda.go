//go:build ringtrain_cuda

package devices

import (
	// First of all, before gorgonia.org/cu's own init: ends the program
	// with one clear line where there is no CUDA device.
	_ "github.com/ringtrain/ringtrain/train/engine/cudaprobe"

	"gorgonia.org/cu"

	"github.com/ringtrain/ringtrain/train/engine"
)

func newCUDA(o engine.CUDAOptions) (engine.Ops, error) { return engine.NewCUDA(0, o) }

// CUDAAvailable says whether there is a device, without opening it.
func CUDAAvailable() error {
	n, err := cu.NumDevices()
	if err == nil && n == 0 {
		err = engine.ErrNoDevice
	}
	return err
}
