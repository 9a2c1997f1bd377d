//go:build ringtrain_cuda

// Package cudaprobe ends a CUDA build of ringtrain at start-up, with one
// line that says why, where there is no CUDA device to run on.
//
// gorgonia.org/cu initialises the driver in its package init and, when that
// fails, prints a long message and exits before main. Go initialises
// packages in the order of their import paths, as far as imports allow, so
// this package (github.com/…, importing nothing of cu's) runs first and
// gets to say it plainly. A machine with no NVIDIA driver at all does not
// get this far: the system's loader stops the program before any of it
// runs, saying libcuda.so.1 cannot be found.
package cudaprobe

// #cgo LDFLAGS: -lcuda
// #include <cuda.h>
// static int probe(int *count) {
//   CUresult r = cuInit(0);
//   if (r != CUDA_SUCCESS) return (int)r;
//   return (int)cuDeviceGetCount(count);
// }
import "C"

import (
	"fmt"
	"os"
)

func init() {
	var n C.int
	if r := C.probe(&n); r != 0 {
		fmt.Fprintf(os.Stderr, "ringtrain: no CUDA device found (the CUDA driver says error %d: %s); this is the CUDA build, use the plain ringtrain binary to train on the CPU\n", int(r), reason(int(r)))
		os.Exit(1)
	}
	if n == 0 {
		fmt.Fprintln(os.Stderr, "ringtrain: no CUDA device found (the driver reports none); this is the CUDA build, use the plain ringtrain binary to train on the CPU")
		os.Exit(1)
	}
}

// reason names the driver errors one meets without a usable GPU.
func reason(r int) string {
	switch r {
	case 34:
		return "CUDA_ERROR_STUB_LIBRARY, the driver library is a link-time stub"
	case 35:
		return "CUDA_ERROR_INSUFFICIENT_DRIVER, the driver is older than CUDA 11.8"
	case 100:
		return "CUDA_ERROR_NO_DEVICE"
	case 999:
		return "CUDA_ERROR_UNKNOWN, often a driver without its kernel module"
	}
	return "see cuda.h's CUresult"
}
