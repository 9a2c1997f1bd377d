#!/bin/sh
# Remakes kernels.ptx from kernels.cu. NVCC and CCBIN pick the compiler and
# the host compiler; `make ptx` sets them to a toolkit it unpacks into a
# cache folder. CUDA 11.8's nvcc does not know gcc 12, which only
# preprocesses here, hence -allow-unsupported-compiler; the host compiler is
# named by its full path so that the toolkit's own g++ wrapper, which
# refuses gcc 12, is passed over. -fmad=false keeps nvcc from fusing a
# multiply and an add into one rounding: the optimizer kernels must round
# as train's Go optimizers do, so GPU and CPU replicas apply the same bits.
set -eu
"${NVCC:-nvcc}" -ccbin "${CCBIN:-$(command -v g++)}" -allow-unsupported-compiler --ptx -fmad=false -arch=compute_52 -o kernels.ptx kernels.cu
