// Package ptx holds the CUDA engine's kernels as PTX, generated from
// kernels.cu by nvcc and committed, so that building and CI need no nvcc.
// It has no cgo: the table of kernels and their parameters is checked
// against the PTX text on any machine.
package ptx

import (
	_ "embed" // for the PTX text
)

//go:generate sh gen.sh

// Module is the PTX of every kernel, for cuModuleLoadData. compute_52
// (Maxwell) is the oldest architecture CUDA 11.8 targets; the driver
// compiles PTX for whatever GPU it finds.
//
//go:embed kernels.ptx
var Module string

// Kernels names every kernel in Module with how many parameters it takes
// (all 8 bytes wide); the engine launches nothing else.
var Kernels = map[string]int{
	"im2col_batch":            10,
	"col2im_batch":            10,
	"unbatch_bias":            6,
	"rebatch":                 5,
	"bias_add":                5,
	"bias_grad_part":          6,
	"bias_grad_rows":          6,
	"bias_grad_sum":           4,
	"relu":                    3,
	"relu_backward":           4,
	"max_pool":                8,
	"max_pool_backward":       9,
	"softmax_xent":            7,
	"nonfinite":               3,
	"sgd":                     6,
	"adam":                    7,
	"embed":                   7,
	"embed_grad":              6,
	"token_rows":              4,
	"embed_grad_lists":        7,
	"pos_grad":                5,
	"layer_norm":              7,
	"layer_norm_backward":     7,
	"normalized_product":      6,
	"gelu":                    3,
	"gelu_backward":           4,
	"causal_softmax":          3,
	"causal_softmax_backward": 4,
	"add":                     4,
	"accumulate":              3,
	"scale":                   5,
}
