//go:build !ringtrain_cuda

package devices

import "github.com/ringtrain/ringtrain/train/engine"

func newCUDA(engine.CUDAOptions) (engine.Ops, error) { return nil, ErrNoCUDA }

func CUDAAvailable() error { return ErrNoCUDA }
