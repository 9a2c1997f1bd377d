// Package engine is ringtrain's own small compute engine for the layers of
// the built-in models — linear, conv2d (im2col + GEMM over the whole
// batch), maxpool2d, ReLU, flatten — and of the byte-level GPT — the
// embedding of tokens and positions, layernorm, causal multi-head
// attention (strided batched GEMMs per head), GELU and residual adds —
// softmax cross-entropy, and the SGD, Adam and AdamW updates. It exists for
// the GPU: gorgonia's CUDA engine links cuDNN, which cannot be had where
// the project builds, so the CUDA path is this engine on the CUDA driver
// API (gorgonia.org/cu for the device and context), cuBLAS and, where the
// host has it, cuDNN for the convolutions (both opened at run time; build
// tag ringtrain_cuda), with its kernels committed as PTX (package ptx).
// An Ops that convolves directly (cuDNN) is used in place of im2col and a
// GEMM for each conv layer it can plan.
//
// The network logic (Net: which primitive runs when, on which buffers) is
// written once against Ops, the device primitives. Two Ops exist: Host, in
// pure Go, and CUDA (cuda.go, -tags ringtrain_cuda). Host runs every
// kernel by calling, for each thread index (or block), the same function
// body the CUDA kernel has (threads.go mirrors ptx/kernels.cu line for
// line), so the index arithmetic and the rounding the GPU will run are the
// ones the tests check here. Net with Host is tested against the gorgonia
// model's loss and gradients, and Optimizer against train.SGD,
// train.Adam and train.AdamW bit for bit.
//
// Net keeps its parameters, and Optimizer its state, in device memory,
// allocated once when they are built. A step queues its calls on one
// stream and waits once; with a full batch it is replayed from a capture
// (a CUDA graph). Only the gradients cross to the host, into page-locked
// memory, for the ring to average — and on a ring of one, not even those.
// With gradient buckets (ForwardBackwardLayers), each layer's gradients
// are copied on a second stream as soon as backward has them, ordered by
// events (in a captured step, external event records the host waits on),
// while the first stream computes on; the ring's averaged buckets go back
// on that stream too (StageGrads), and the optimizer step sends the rest.
// Params brings the parameters to the host when something asks for them
// (checkpoints, hashes, broadcasts) and sends back what it was given.
package engine
