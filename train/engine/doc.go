// Package engine is ringtrain's own small compute engine for the layers of
// the built-in models — linear, conv2d (im2col + GEMM), maxpool2d, ReLU,
// flatten — and softmax cross-entropy. It exists for the GPU: gorgonia's
// CUDA engine needs cuDNN, which cannot be had here, so the CUDA path is
// this engine on gorgonia.org/cu and cuBLAS (build tag cuda), with its
// kernels committed as PTX (package ptx).
//
// The network logic (Net: which primitive runs when, on which buffers) is
// written once against Ops, the device primitives. Two Ops exist: Host, in
// pure Go, and CUDA (cuda.go, -tags cuda). Host runs every elementwise
// primitive by calling, for each thread index, the same function body the
// CUDA kernel has (threads.go mirrors ptx/kernels.cu line for line), so the
// index arithmetic the GPU will run is the one the tests check here. Net
// with Host is tested against the gorgonia model's loss and gradients.
//
// Net keeps parameters and gradients in host memory, as train.Model asks:
// parameters go to the device before each forward pass and gradients come
// back after each backward pass, for the ring.
package engine
