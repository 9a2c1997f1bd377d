//go:build !ringtrain_cuda

package main

import "github.com/ringtrain/ringtrain/train/engine"

func newCUDA(engine.CUDAOptions) (engine.Ops, error) { return nil, errNoCUDA }

func cudaAvailable() error { return errNoCUDA }
