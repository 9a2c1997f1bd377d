//go:build ringtrain_cuda

package engine

// #cgo LDFLAGS: -lcuda -ldl
// #include <cuda.h>
// #include <dlfcn.h>
// #include <stdint.h>
// #include <stdlib.h>
//
// // cuBLAS is opened at run time (dlopen), not linked: one binary then runs
// // on hosts with CUDA 11, 12 or 13's libcublas, whose sonames and symbol
// // versions differ. These are the few entry points the engine uses; their
// // signatures are the same in all three.
// typedef int (*blasCreate)(void **);
// typedef int (*blasDestroy)(void *);
// typedef int (*blasSetStream)(void *, CUstream);
// typedef int (*blasSetMathMode)(void *, int);
// typedef int (*blasSetWorkspace)(void *, void *, size_t);
// typedef int (*blasGetVersion)(void *, int *);
// typedef int (*blasSgemm)(void *, int, int, int, int, int, const float *, const float *, int,
//                          const float *, int, const float *, float *, int);
// typedef int (*blasSgemmStrided)(void *, int, int, int, int, int, const float *, const float *, int, long long,
//                                 const float *, int, long long, const float *, float *, int, long long, int);
// typedef struct {
//   void *lib, *h;
//   blasDestroy destroy;
//   blasSgemm sgemm;
//   blasSgemmStrided sgemmStrided;
// } blas;
//
// // rt_blas_open loads path (after lt, cuBLASLt, which it needs, when given)
// // and starts a handle on stream s: 0, or -1 when the library cannot be
// // loaded, -2 when it lacks a symbol, else cuBLAS's status.
// static int rt_blas_open(blas *b, const char *lt, const char *path, CUstream s, int tf32, CUdeviceptr ws, size_t wsBytes, int *version) {
//   if (lt != NULL) dlopen(lt, RTLD_NOW | RTLD_GLOBAL);
//   b->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
//   if (b->lib == NULL) return -1;
//   blasCreate create = (blasCreate)dlsym(b->lib, "cublasCreate_v2");
//   blasSetStream setStream = (blasSetStream)dlsym(b->lib, "cublasSetStream_v2");
//   blasSetMathMode setMath = (blasSetMathMode)dlsym(b->lib, "cublasSetMathMode");
//   blasSetWorkspace setWs = (blasSetWorkspace)dlsym(b->lib, "cublasSetWorkspace_v2");
//   blasGetVersion getVersion = (blasGetVersion)dlsym(b->lib, "cublasGetVersion_v2");
//   b->destroy = (blasDestroy)dlsym(b->lib, "cublasDestroy_v2");
//   b->sgemm = (blasSgemm)dlsym(b->lib, "cublasSgemm_v2");
//   b->sgemmStrided = (blasSgemmStrided)dlsym(b->lib, "cublasSgemmStridedBatched");
//   if (!create || !setStream || !setMath || !b->destroy || !b->sgemm || !b->sgemmStrided || !getVersion) { dlclose(b->lib); return -2; }
//   int r = create(&b->h);
//   if (r) { dlclose(b->lib); return r; }
//   getVersion(b->h, version);
//   if ((r = setStream(b->h, s)) || (r = setMath(b->h, tf32 ? 3 : 0))) { b->destroy(b->h); dlclose(b->lib); return r; }
//   // A workspace of our own: cuBLAS then allocates nothing while a step is
//   // captured into a graph.
//   if (setWs && wsBytes && (r = setWs(b->h, (void *)ws, wsBytes))) { b->destroy(b->h); dlclose(b->lib); return r; }
//   return 0;
// }
// static void rt_blas_close(blas *b) { b->destroy(b->h); dlclose(b->lib); }
// static int rt_sgemm(blas *b, int ta, int tb, int m, int n, int k, CUdeviceptr a, int lda, CUdeviceptr bb, int ldb, float beta, CUdeviceptr c, int ldc) {
//   float one = 1.f;
//   return b->sgemm(b->h, ta, tb, m, n, k, &one, (const float *)a, lda, (const float *)bb, ldb, &beta, (float *)c, ldc);
// }
// static int rt_sgemm_strided(blas *b, int ta, int tb, int m, int n, int k, float alpha, CUdeviceptr a, int lda, long long sa,
//                             CUdeviceptr bb, int ldb, long long sb, float beta, CUdeviceptr c, int ldc, long long sc, int batch) {
//   return b->sgemmStrided(b->h, ta, tb, m, n, k, &alpha, (const float *)a, lda, sa, (const float *)bb, ldb, sb, &beta, (float *)c, ldc, sc, batch);
// }
//
// // rt_launch launches f on s with n 64-bit arguments (the kernels take
// // nothing else); the driver copies them before it returns.
// static CUresult rt_launch(CUfunction f, unsigned grid, unsigned block, CUstream s, uint64_t *args, int n) {
//   void *p[16];
//   for (int i = 0; i < n && i < 16; i++) p[i] = &args[i];
//   return cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, s, p, NULL);
// }
// static CUresult rt_capture(CUstream s) { return cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED); }
// static CUresult rt_end_capture(CUstream s, CUgraphExec *exec) {
//   CUgraph g;
//   CUresult r = cuStreamEndCapture(s, &g);
//   if (r != CUDA_SUCCESS) return r;
//   r = cuGraphInstantiateWithFlags(exec, g, 0);
//   cuGraphDestroy(g);
//   return r;
// }
// static const char *rt_error(CUresult r) {
//   const char *s = NULL;
//   if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == NULL) return "unknown CUDA error";
//   return s;
// }
import "C"

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/ringtrain/ringtrain/train/engine/ptx"
)

// The tag is ringtrain_cuda, not cuda: with cuda, gorgonia itself switches
// to its own CUDA engine, which imports cuDNN (gorgonia.org/cu/dnn) and does
// not build here.
//
// gorgonia.org/cu finds the device and makes the context; the calls a step
// makes (launches, copies, cuBLAS, graph capture) go straight to the driver
// API from the C above, on one stream.

// ErrNoDevice means there is no CUDA device to run on.
var ErrNoDevice = errors.New("engine: no CUDA device found")

// ErrNoCUBLAS means no cuBLAS library could be loaded.
var ErrNoCUBLAS = errors.New("engine: cuBLAS not found")

// CUDA is Ops on an NVIDIA GPU: cuBLAS for Gemm, cuDNN for the
// convolutions where the host has it, the kernels of package ptx for the
// rest, all queued on one stream. Each call makes the context
// current on a locked OS thread, since a CUDA context belongs to a thread
// and goroutines move between threads.
type CUDA struct {
	name   string
	ctx    cu.CUContext
	stream C.CUstream
	mod    C.CUmodule
	fns    map[string]C.CUfunction
	bl     C.blas
	blas   string // which library, for logs
	ws     C.CUdeviceptr
	mem    []C.CUdeviceptr
	pinned []unsafe.Pointer
	graphs []C.CUgraphExec
	dnn    dnnState
	// copies is DownloadBeside's stream; events, every event made for it
	// (destroyed at Close), spare those no copy holds now.
	copies C.CUstream
	events []C.CUevent
	spare  []C.CUevent
	// capturing: Capture's f is queuing; forked: a DownloadBeside in it
	// put the copies' stream into the capture, which must join back.
	capturing, forked bool
	// scratches: see scratch.
	scratches map[int]Buf
}

type devBuf struct {
	p C.CUdeviceptr
	n int
}

func (b devBuf) Len() int { return b.n }

func dev(b Buf) devBuf { return b.(devBuf) }

// cuErr turns a driver result into an error naming what failed.
func cuErr(r C.CUresult, what string) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return fmt.Errorf("engine: %s: %s (CUDA error %d)", what, C.GoString(C.rt_error(r)), int(r))
}

// cuBLAS's workspace: what NVIDIA recommends for Hopper.
const workspaceBytes = 32 << 20

// NewCUDA opens device ordinal, loads the kernels and starts cuBLAS.
func NewCUDA(ordinal int, opt CUDAOptions) (_ *CUDA, err error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("%w: device %d asked for, %d present", ErrNoDevice, ordinal, n)
	}
	d, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, err
	}
	name, _ := d.Name()
	c := &CUDA{name: fmt.Sprintf("cuda:%d (%s)", ordinal, name), fns: map[string]C.CUfunction{}}
	c.dnn.anyAlgo = opt.AnyConvAlgo
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if c.ctx, err = d.MakeContext(cu.SchedAuto); err != nil {
		return nil, fmt.Errorf("engine: creating a context on %s: %w", c.name, err)
	}
	defer func() {
		if err != nil {
			c.ctx.Destroy()
		}
	}()
	if err := cuErr(C.cuStreamCreate(&c.stream, C.CU_STREAM_NON_BLOCKING), "creating a stream"); err != nil {
		return nil, err
	}
	text := C.CString(ptx.Module)
	defer C.free(unsafe.Pointer(text))
	if err := cuErr(C.cuModuleLoadData(&c.mod, unsafe.Pointer(text)), "loading the kernels' PTX"); err != nil {
		return nil, err
	}
	for k := range ptx.Kernels {
		var f C.CUfunction
		ck := C.CString(k)
		r := C.cuModuleGetFunction(&f, c.mod, ck)
		C.free(unsafe.Pointer(ck))
		if err := cuErr(r, "kernel "+k); err != nil {
			return nil, err
		}
		c.fns[k] = f
	}
	if err := cuErr(C.cuMemAlloc(&c.ws, workspaceBytes), "cuBLAS workspace"); err != nil {
		return nil, err
	}
	c.mem = append(c.mem, c.ws)
	if err := c.openBLAS(opt.TF32); err != nil {
		return nil, err
	}
	c.dnn.tf32 = opt.TF32
	c.openDNN()
	return c, nil
}

// openBLAS loads cuBLAS: RINGTRAIN_CUBLAS if set, else the newest of
// CUDA 13, 12 and 11's on the loader's path, else in the usual CUDA
// install folders (which are often not on the loader's path).
func (c *CUDA) openBLAS(tf32 bool) error {
	var tries []string
	if p := os.Getenv("RINGTRAIN_CUBLAS"); p != "" {
		tries = []string{p}
	} else {
		var dirs []string
		for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
			if h := os.Getenv(env); h != "" {
				dirs = append(dirs, filepath.Join(h, "lib64"), filepath.Join(h, "targets/x86_64-linux/lib"))
			}
		}
		globbed, _ := filepath.Glob("/usr/local/cuda*/targets/x86_64-linux/lib")
		dirs = append(append(dirs, "/usr/local/cuda/lib64"), globbed...)
		for _, major := range []string{"13", "12", "11"} {
			tries = append(tries, "libcublas.so."+major)
			for _, d := range dirs {
				if p := filepath.Join(d, "libcublas.so."+major); fileExists(p) {
					tries = append(tries, p)
				}
			}
		}
	}
	var why []string
	for _, p := range tries {
		var lt *C.char
		if strings.Contains(p, "/") {
			lt = C.CString(filepath.Join(filepath.Dir(p), strings.Replace(filepath.Base(p), "libcublas", "libcublasLt", 1)))
		}
		cp := C.CString(p)
		var version C.int
		r := C.rt_blas_open(&c.bl, lt, cp, c.stream, boolInt(tf32), c.ws, workspaceBytes, &version)
		C.free(unsafe.Pointer(cp))
		C.free(unsafe.Pointer(lt))
		switch r {
		case 0:
			c.blas = fmt.Sprintf("%s (cuBLAS %d)", p, int(version))
			return nil
		case -1:
			why = append(why, p+": "+dlerror())
		case -2:
			why = append(why, p+": lacks a cuBLAS entry point ringtrain uses")
		default:
			return fmt.Errorf("engine: starting cuBLAS from %s: status %d", p, int(r))
		}
	}
	return fmt.Errorf("%w: looked for libcublas.so.13, .12 and .11 on the loader's path and in /usr/local/cuda*; install CUDA's cuBLAS, or set LD_LIBRARY_PATH or RINGTRAIN_CUBLAS to it (%s)",
		ErrNoCUBLAS, strings.Join(why, "; "))
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func dlerror() string {
	if s := C.dlerror(); s != nil {
		return C.GoString(s)
	}
	return "cannot be loaded"
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// on runs f with the context current on this goroutine's locked thread.
func (c *CUDA) on(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(c.ctx); err != nil {
		return err
	}
	return f()
}

// Name says which GPU, and which cuBLAS.
func (c *CUDA) Name() string { return c.name }

// BLAS says which cuBLAS was loaded.
func (c *CUDA) BLAS() string { return c.blas }

func (c *CUDA) Alloc(n int) (Buf, error) {
	var p C.CUdeviceptr
	err := c.on(func() error {
		if err := cuErr(C.cuMemAlloc(&p, C.size_t(4*max(n, 1))), fmt.Sprintf("allocating %.1f MiB", mib(4*int64(n)))); err != nil {
			return err
		}
		return cuErr(C.cuMemsetD32(p, 0, C.size_t(max(n, 1))), "zeroing")
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %d floats on %s: %w", n, c.name, err)
	}
	c.mem = append(c.mem, p)
	return devBuf{p, n}, nil
}

func (c *CUDA) Free() (free, total int64) {
	var f, t C.size_t
	if c.on(func() error { return cuErr(C.cuMemGetInfo(&f, &t), "memory info") }) != nil {
		return 0, 0
	}
	return int64(f), int64(t)
}

func (c *CUDA) Slice(b Buf, off, n int) Buf {
	d := dev(b)
	if off < 0 || n < 0 || off+n > d.n {
		panic(fmt.Sprintf("engine: slice [%d:%d] of a %d-float buffer", off, off+n, d.n)) // a bug in Net, not input
	}
	return devBuf{d.p + C.CUdeviceptr(4*off), n}
}

func (c *CUDA) Pinned(n int) ([]float32, error) {
	var p unsafe.Pointer
	err := c.on(func() error { return cuErr(C.cuMemAllocHost(&p, C.size_t(4*max(n, 1))), "page-locked host memory") })
	if err != nil {
		return nil, err
	}
	c.pinned = append(c.pinned, p)
	return unsafe.Slice((*float32)(p), n), nil
}

func sameLen(n, m int, what string) error {
	if n != m {
		return fmt.Errorf("engine: %s of %d values into %d", what, m, n)
	}
	return nil
}

// Upload copies Go memory: queued on the stream, waited for, since the
// driver may read src until the copy has run.
func (c *CUDA) Upload(dst Buf, src []float32) error {
	d := dev(dst)
	if err := sameLen(d.n, len(src), "upload"); err != nil || d.n == 0 {
		return err
	}
	return c.on(func() error {
		if err := cuErr(C.cuMemcpyHtoDAsync(d.p, unsafe.Pointer(&src[0]), C.size_t(4*d.n), c.stream), "copy to the device"); err != nil {
			return err
		}
		return cuErr(C.cuStreamSynchronize(c.stream), "copy to the device")
	})
}

func (c *CUDA) Download(dst []float32, src Buf) error {
	s := dev(src)
	if err := sameLen(len(dst), s.n, "download"); err != nil || s.n == 0 {
		return err
	}
	return c.on(func() error {
		if err := cuErr(C.cuMemcpyDtoHAsync(unsafe.Pointer(&dst[0]), s.p, C.size_t(4*s.n), c.stream), "copy from the device"); err != nil {
			return err
		}
		return cuErr(C.cuStreamSynchronize(c.stream), "copy from the device")
	})
}

// UploadAsync and DownloadAsync take page-locked memory from Pinned, which
// is C memory: the driver may use it after the call.
func (c *CUDA) UploadAsync(dst Buf, src []float32) error {
	d := dev(dst)
	if err := sameLen(d.n, len(src), "upload"); err != nil || d.n == 0 {
		return err
	}
	return c.on(func() error {
		return cuErr(C.cuMemcpyHtoDAsync(d.p, unsafe.Pointer(unsafe.SliceData(src)), C.size_t(4*d.n), c.stream), "copy to the device")
	})
}

func (c *CUDA) DownloadAsync(dst []float32, src Buf) error {
	s := dev(src)
	if err := sameLen(len(dst), s.n, "download"); err != nil || s.n == 0 {
		return err
	}
	return c.on(func() error {
		return cuErr(C.cuMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), s.p, C.size_t(4*s.n), c.stream), "copy from the device")
	})
}

// DownloadBeside queues the copy on a stream of its own that waits for an
// event recorded on the compute stream, and records a second event after
// it for wait; both go back to the spares once waited for.
func (c *CUDA) DownloadBeside(dst []float32, src Buf) (func() error, error) {
	s := dev(src)
	if err := sameLen(len(dst), s.n, "download"); err != nil {
		return nil, err
	}
	if s.n == 0 {
		return func() error { return nil }, nil
	}
	var computed, copied C.CUevent
	err := c.on(func() error {
		if err := c.copiesStream(); err != nil {
			return err
		}
		var err error
		if computed, err = c.event(); err != nil {
			return err
		}
		if copied, err = c.event(); err != nil {
			c.spare = append(c.spare, computed)
			return err
		}
		var e errs
		e.do(cuErr(C.cuEventRecord(computed, c.stream), "marking the gradients computed"))
		e.do(cuErr(C.cuStreamWaitEvent(c.copies, computed, 0), "ordering a copy after its gradients"))
		e.do(cuErr(C.cuMemcpyDtoHAsync(unsafe.Pointer(unsafe.SliceData(dst)), s.p, C.size_t(4*s.n), c.copies), "copy from the device"))
		if c.capturing {
			// An external event node: each launch of the graph records it
			// when the copy is done, for the host to wait on.
			c.forked = true
			e.do(cuErr(C.cuEventRecordWithFlags(copied, c.copies, C.CU_EVENT_RECORD_EXTERNAL), "marking a captured copy done"))
		} else {
			e.do(cuErr(C.cuEventRecord(copied, c.copies), "marking a copy done"))
		}
		return e.err
	})
	if err != nil {
		return nil, err
	}
	if c.capturing { // the graph keeps both events; wait is for every replay
		return func() error {
			return c.on(func() error { return cuErr(C.cuEventSynchronize(copied), "copy from the device") })
		}, nil
	}
	waited := false
	return func() error {
		if waited {
			return nil
		}
		waited = true
		return c.on(func() error {
			err := cuErr(C.cuEventSynchronize(copied), "copy from the device")
			c.spare = append(c.spare, computed, copied)
			return err
		})
	}, nil
}

// join makes the capture's stream wait for the copies' stream, which a
// DownloadBeside forked from it: a capture must end with its streams
// joined. Call it inside on.
func (c *CUDA) join() error {
	ev, err := c.event()
	if err != nil {
		return err
	}
	var e errs
	e.do(cuErr(C.cuEventRecord(ev, c.copies), "marking the captured copies"))
	e.do(cuErr(C.cuStreamWaitEvent(c.stream, ev, 0), "joining the captured copies"))
	return e.err
}

// UploadBeside queues the copy on the copies' stream, after the copies
// queued there before it (a range's DownloadBeside, say).
func (c *CUDA) UploadBeside(dst Buf, src []float32) error {
	d := dev(dst)
	if err := sameLen(d.n, len(src), "upload"); err != nil || d.n == 0 {
		return err
	}
	return c.on(func() error {
		if err := c.copiesStream(); err != nil {
			return err
		}
		return cuErr(C.cuMemcpyHtoDAsync(d.p, unsafe.Pointer(unsafe.SliceData(src)), C.size_t(4*d.n), c.copies), "copy to the device")
	})
}

// copiesStream makes the copies' stream, once. Call it inside on.
func (c *CUDA) copiesStream() error {
	if c.copies != nil {
		return nil
	}
	return cuErr(C.cuStreamCreate(&c.copies, C.CU_STREAM_NON_BLOCKING), "creating the copies' stream")
}

// event returns a spare event, or a new one (without timing, which would
// cost each record a clock read). Call it inside on.
func (c *CUDA) event() (C.CUevent, error) {
	if k := len(c.spare); k > 0 {
		ev := c.spare[k-1]
		c.spare = c.spare[:k-1]
		return ev, nil
	}
	var ev C.CUevent
	if err := cuErr(C.cuEventCreate(&ev, C.CU_EVENT_DISABLE_TIMING), "creating an event"); err != nil {
		return nil, err
	}
	c.events = append(c.events, ev)
	return ev, nil
}

func (c *CUDA) Zero(b Buf) error {
	d := dev(b)
	if d.n == 0 {
		return nil
	}
	return c.on(func() error { return cuErr(C.cuMemsetD32Async(d.p, 0, C.size_t(d.n), c.stream), "zeroing") })
}

func (c *CUDA) Sync() error {
	return c.on(func() error {
		if err := cuErr(C.cuStreamSynchronize(c.stream), "running the queued work"); err != nil || c.copies == nil {
			return err
		}
		return cuErr(C.cuStreamSynchronize(c.copies), "finishing the copies")
	})
}

// Capture records what f queues into a CUDA graph, instantiates it and
// launches it once; the replay launches it again.
func (c *CUDA) Capture(f func() error) (func() error, error) {
	var exec C.CUgraphExec
	err := c.on(func() error {
		if err := cuErr(C.rt_capture(c.stream), "starting a graph capture"); err != nil {
			return err
		}
		c.capturing = true
		ferr := f()
		c.capturing = false
		if c.forked { // the copies' stream joins the capture's stream again
			c.forked = false
			if err := c.join(); ferr == nil {
				ferr = err
			}
		}
		// f's calls ran on this locked thread too: c.on nests.
		end := cuErr(C.rt_end_capture(c.stream, &exec), "capturing the step into a graph")
		if ferr != nil {
			if end == nil {
				C.cuGraphExecDestroy(exec)
			}
			return ferr
		}
		return end
	})
	if err != nil {
		return nil, err
	}
	c.graphs = append(c.graphs, exec)
	replay := func() error {
		return c.on(func() error { return cuErr(C.cuGraphLaunch(exec, c.stream), "launching the step's graph") })
	}
	return replay, replay()
}

// Gemm is row-major; cuBLAS is column-major, and a row-major matrix is its
// transpose in column-major, so C = A·B is computed as Cᵀ = Bᵀ·Aᵀ with
// the operands swapped and the leading dimensions unchanged.
func (c *CUDA) Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, out Buf) error {
	_, _, lda, ldb := gemmArgs(transA, transB, m, n, k)
	op := func(t bool) C.int {
		if t {
			return 1 // CUBLAS_OP_T
		}
		return 0
	}
	return c.on(func() error {
		if r := C.rt_sgemm(&c.bl, op(transB), op(transA), C.int(n), C.int(m), C.int(k), dev(b).p, C.int(ldb), dev(a).p, C.int(lda),
			C.float(beta), dev(out).p, C.int(n)); r != 0 {
			return fmt.Errorf("engine: cuBLAS sgemm (%d×%d×%d): status %d", m, n, k, int(r))
		}
		return nil
	})
}

// GemmStrided is Gemm's swap for a batch: cuBLAS's strided batched SGEMM
// computes every Cᵢᵀ = Bᵢᵀ·Aᵢᵀ in one launch.
func (c *CUDA) GemmStrided(transA, transB bool, m, n, k int, alpha float32, a Buf, lda, strideA int, b Buf, ldb, strideB int,
	beta float32, out Buf, ldc, strideC int, batch int) error {
	op := func(t bool) C.int {
		if t {
			return 1 // CUBLAS_OP_T
		}
		return 0
	}
	return c.on(func() error {
		if r := C.rt_sgemm_strided(&c.bl, op(transB), op(transA), C.int(n), C.int(m), C.int(k), C.float(alpha),
			dev(b).p, C.int(ldb), C.longlong(strideB), dev(a).p, C.int(lda), C.longlong(strideA),
			C.float(beta), dev(out).p, C.int(ldc), C.longlong(strideC), C.int(batch)); r != 0 {
			return fmt.Errorf("engine: cuBLAS strided batched sgemm (%d of %d×%d×%d): status %d", batch, m, n, k, int(r))
		}
		return nil
	})
}

// launch queues kernel name over n threads (grid blocks of block threads
// when grid is given) with the given arguments, each widened to a 64-bit
// word.
func (c *CUDA) launch(name string, grid, block int, args ...any) error {
	if want := ptx.Kernels[name]; want != len(args) {
		return fmt.Errorf("engine: kernel %s takes %d arguments, given %d", name, want, len(args))
	}
	if grid <= 0 {
		return nil
	}
	var words [16]C.uint64_t
	for i, a := range args {
		switch v := a.(type) {
		case Buf:
			words[i] = C.uint64_t(dev(v).p)
		case int:
			words[i] = C.uint64_t(int64(v))
		default:
			return fmt.Errorf("engine: kernel %s argument %d is a %T", name, i, a)
		}
	}
	return c.on(func() error {
		return cuErr(C.rt_launch(c.fns[name], C.uint(grid), C.uint(block), c.stream, &words[0], C.int(len(args))), "kernel "+name)
	})
}

// over launches one thread per element of n.
func (c *CUDA) over(name string, n int, args ...any) error {
	grid, block := Launch(n)
	return c.launch(name, grid, block, args...)
}

func (c *CUDA) Im2colBatch(x, col Buf, g Conv, batch int) error {
	return c.over("im2col_batch", g.ColRows()*batch*g.ColCols(), x, col, batch, g.C, g.H, g.W, g.K, g.Pad, g.OH, g.OW)
}

func (c *CUDA) Col2imBatch(col, dx Buf, g Conv, batch int) error {
	return c.over("col2im_batch", batch*g.C*g.H*g.W, col, dx, batch, g.C, g.H, g.W, g.K, g.Pad, g.OH, g.OW)
}

func (c *CUDA) UnbatchBias(t, b, y Buf, batch, chans, inner int) error {
	return c.over("unbatch_bias", batch*chans*inner, t, b, y, batch, chans, inner)
}

func (c *CUDA) Rebatch(y, t Buf, batch, chans, inner int) error {
	return c.over("rebatch", batch*chans*inner, y, t, batch, chans, inner)
}

func (c *CUDA) BiasAdd(y, b Buf, rows, cols, inner int) error {
	return c.over("bias_add", rows*cols*inner, y, b, rows*cols*inner, cols, inner)
}

// BiasGrad sums each channel's parts (a block of blockSize threads a part,
// or one thread a column and part where inner is 1) into a scratch buffer
// kept for the shape, then the parts in order (see BiasSplit). A part
// alone goes straight to db.
func (c *CUDA) BiasGrad(dy, db Buf, rows, cols, inner int) error {
	sp := NewBiasSplit(rows, inner)
	part := db
	if sp.Parts > 1 {
		var err error
		if part, err = c.scratch(sp.Parts * cols); err != nil {
			return err
		}
	}
	var err error
	if inner == 1 {
		err = c.over("bias_grad_rows", sp.Parts*cols, dy, part, rows, cols, sp.Seg, sp.Parts)
	} else {
		err = c.launch("bias_grad_part", sp.Parts*cols, blockSize, dy, part, rows, cols, inner, sp.Seg)
	}
	if err != nil || sp.Parts == 1 {
		return err
	}
	return c.over("bias_grad_sum", cols, part, db, cols, sp.Parts)
}

// scratch is a buffer of n floats for the queued calls' intermediate sums,
// one per size, kept until Close: a captured graph holds its address, and
// the stream runs the calls that share it one after the other.
func (c *CUDA) scratch(n int) (Buf, error) {
	if b, ok := c.scratches[n]; ok {
		return b, nil
	}
	b, err := c.Alloc(n)
	if err != nil {
		return nil, err
	}
	if c.scratches == nil {
		c.scratches = map[int]Buf{}
	}
	c.scratches[n] = b
	return b, nil
}

func (c *CUDA) Relu(x, y Buf) error { return c.over("relu", x.Len(), x, y, x.Len()) }

func (c *CUDA) ReluBackward(y, dy, dx Buf) error {
	return c.over("relu_backward", y.Len(), y, dy, dx, y.Len())
}

func (c *CUDA) MaxPool(x, y Buf, g Pool) error {
	return c.over("max_pool", g.Planes*g.OH*g.OW, x, y, g.Planes, g.H, g.W, g.K, g.OH, g.OW)
}

func (c *CUDA) MaxPoolBackward(x, dy, dx Buf, g Pool) error {
	return c.over("max_pool_backward", g.Planes*g.H*g.W, x, dy, dx, g.Planes, g.H, g.W, g.K, g.OH, g.OW)
}

func (c *CUDA) SoftmaxXent(logits, labels, grad, loss Buf, rows, n, classes int) error {
	return c.over("softmax_xent", rows, logits, labels, grad, loss, rows, n, classes)
}

func (c *CUDA) NonFinite(g, flag Buf) error { return c.over("nonfinite", g.Len(), g, flag, g.Len()) }

func (c *CUDA) SGD(p, g, v, hyper, skip Buf) error {
	if v.Len() == 0 { // no momentum: the kernel never reads v
		v = p
	}
	return c.over("sgd", p.Len(), p, g, v, hyper, skip, p.Len())
}

func (c *CUDA) Adam(p, g, m, v, hyper, skip Buf) error {
	return c.over("adam", p.Len(), p, g, m, v, hyper, skip, p.Len())
}

func (c *CUDA) Embed(tok, table, pos, y Buf, rows, T, dim int) error {
	return c.over("embed", rows*dim, tok, table, pos, y, rows, T, dim)
}

// maxTokenLists bounds token_rows' lists (vocabulary × rows ints): above
// it, the table's gradient is gathered by every thread reading every token.
const maxTokenLists = 1 << 26

// EmbedGrad lists each token's rows first (token_rows, a block a token),
// so a thread of the table's gradient reads only its token's rows — in row
// order, the gather's bits — instead of every token of the batch.
func (c *CUDA) EmbedGrad(tok, dy, dTable, dPos Buf, rows, T, dim int) error {
	var err error
	if V := dTable.Len() / dim; V*rows > maxTokenLists || V*dim != dTable.Len() {
		err = c.over("embed_grad", dTable.Len(), tok, dy, dTable, dTable.Len(), rows, dim)
	} else {
		var lists Buf
		if lists, err = c.scratch(V*rows + V); err != nil {
			return err
		}
		order, counts := c.Slice(lists, 0, V*rows), c.Slice(lists, V*rows, V)
		if err = c.launch("token_rows", V, tokenBlock, tok, order, counts, rows); err == nil {
			err = c.over("embed_grad_lists", dTable.Len(), order, counts, dy, dTable, dTable.Len(), rows, dim)
		}
	}
	if err != nil {
		return err
	}
	return c.over("pos_grad", T*dim, dy, dPos, rows, T, dim)
}

func (c *CUDA) LayerNorm(x, g, b, y, stats Buf, rows, dim int) error {
	return c.launch("layer_norm", rows, warp, x, g, b, y, stats, rows, dim)
}

func (c *CUDA) LayerNormBackward(x, g, stats, dy, dx Buf, rows, dim int) error {
	return c.launch("layer_norm_backward", rows, warp, x, g, stats, dy, dx, rows, dim)
}

func (c *CUDA) NormalizedProduct(x, stats, dy, out Buf, rows, dim int) error {
	return c.over("normalized_product", rows*dim, x, stats, dy, out, rows, dim)
}

func (c *CUDA) GELU(x, y Buf) error { return c.over("gelu", x.Len(), x, y, x.Len()) }

func (c *CUDA) GELUBackward(x, dy, dx Buf) error {
	return c.over("gelu_backward", x.Len(), x, dy, dx, x.Len())
}

func (c *CUDA) CausalSoftmax(s Buf, rows, T int) error {
	return c.launch("causal_softmax", rows, warp, s, rows, T)
}

func (c *CUDA) CausalSoftmaxBackward(p, dp Buf, rows, T int) error {
	return c.launch("causal_softmax_backward", rows, warp, p, dp, rows, T)
}

func (c *CUDA) Add(a, b, y Buf) error { return c.over("add", y.Len(), a, b, y, y.Len()) }

func (c *CUDA) Accumulate(y, x Buf) error { return c.over("accumulate", y.Len(), y, x, y.Len()) }

func (c *CUDA) Scale(p, hyper Buf, at int, skip Buf) error {
	return c.over("scale", p.Len(), p, hyper, at, skip, p.Len())
}

// Close frees every buffer, graph and page, cuBLAS, cuDNN, the kernels
// and the context.
func (c *CUDA) Close() error {
	return c.on(func() error {
		var errs []error
		errs = append(errs, cuErr(C.cuStreamSynchronize(c.stream), "finishing"))
		if c.copies != nil {
			errs = append(errs, cuErr(C.cuStreamSynchronize(c.copies), "finishing the copies"))
		}
		for _, g := range c.graphs { // before the events their nodes record
			errs = append(errs, cuErr(C.cuGraphExecDestroy(g), "freeing a graph"))
		}
		for _, ev := range c.events {
			errs = append(errs, cuErr(C.cuEventDestroy(ev), "destroying an event"))
		}
		if c.copies != nil {
			errs = append(errs, cuErr(C.cuStreamDestroy(c.copies), "destroying the copies' stream"))
		}
		c.copies, c.events, c.spare = nil, nil, nil
		C.rt_blas_close(&c.bl)
		errs = append(errs, c.closeDNN())
		for _, p := range c.mem {
			errs = append(errs, cuErr(C.cuMemFree(p), "freeing device memory"))
		}
		for _, p := range c.pinned {
			errs = append(errs, cuErr(C.cuMemFreeHost(p), "freeing page-locked memory"))
		}
		c.graphs, c.mem, c.pinned = nil, nil, nil
		errs = append(errs, cuErr(C.cuModuleUnload(c.mod), "unloading the kernels"), cuErr(C.cuStreamDestroy(c.stream), "destroying the stream"), c.ctx.Destroy())
		return errors.Join(errs...)
	})
}
