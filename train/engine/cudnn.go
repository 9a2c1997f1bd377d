//go:build ringtrain_cuda

package engine

// #include <cuda.h>
// #include <dlfcn.h>
// #include <stdlib.h>
//
// // cuDNN is opened at run time, as cuBLAS is, and only its legacy
// // convolution API is used: the same entry points and enum values in
// // cuDNN 8 and 9. The enums below are cuDNN's own numbers.
// enum { DNN_NCHW = 0, DNN_FLOAT = 0, DNN_CROSS_CORRELATION = 1,
//        DNN_DEFAULT_MATH = 0, DNN_ALLOW_CONVERSION = 2, DNN_FMA_MATH = 3, DNN_DETERMINISTIC = 1 };
// // cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t share this layout.
// typedef struct { int algo, status; float time; size_t memory; int determinism, mathType; int reserved[3]; } dnnPerf;
// typedef int (*dnnRun)(void *, const void *, void *, const void *, void *, const void *, void *, int, void *, size_t,
//                       const void *, void *, void *);
// typedef int (*dnnFind)(void *, void *, const void *, void *, const void *, void *, void *, void *, int, int *, dnnPerf *,
//                        void *, size_t);
// typedef struct {
//   void *lib, *h;
//   int (*destroy)(void *);
//   int (*createTensor)(void **), (*setTensor)(void *, int, int, int, int, int, int), (*destroyTensor)(void *);
//   int (*createFilter)(void **), (*setFilter)(void *, int, int, int, int, int, int), (*destroyFilter)(void *);
//   int (*createConv)(void **), (*setConv)(void *, int, int, int, int, int, int, int, int), (*destroyConv)(void *);
//   int (*setMath)(void *, int);
//   dnnFind find[3];
//   dnnRun run[3];
//   const char *(*errorString)(int);
// } dnn;
//
// // A plan: the descriptors of x, y and w, and per direction (forward,
// // backward data, backward filter) a convolution descriptor carrying the
// // math type its algorithm was timed with, the algorithm and its
// // workspace.
// typedef struct { void *x, *y, *w, *conv[3]; int algo[3]; size_t ws[3]; } dnnPlan;
//
// static int rt_dnn_open(dnn *d, const char *path, CUstream s, size_t *version, const char **missing) {
//   d->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
//   if (d->lib == NULL) return -1;
//   int (*create)(void **) = dlsym(d->lib, "cudnnCreate");
//   int (*setStream)(void *, CUstream) = dlsym(d->lib, "cudnnSetStream");
//   size_t (*getVersion)(void) = dlsym(d->lib, "cudnnGetVersion");
//   d->destroy = dlsym(d->lib, "cudnnDestroy");
//   d->createTensor = dlsym(d->lib, "cudnnCreateTensorDescriptor");
//   d->setTensor = dlsym(d->lib, "cudnnSetTensor4dDescriptor");
//   d->destroyTensor = dlsym(d->lib, "cudnnDestroyTensorDescriptor");
//   d->createFilter = dlsym(d->lib, "cudnnCreateFilterDescriptor");
//   d->setFilter = dlsym(d->lib, "cudnnSetFilter4dDescriptor");
//   d->destroyFilter = dlsym(d->lib, "cudnnDestroyFilterDescriptor");
//   d->createConv = dlsym(d->lib, "cudnnCreateConvolutionDescriptor");
//   d->setConv = dlsym(d->lib, "cudnnSetConvolution2dDescriptor");
//   d->destroyConv = dlsym(d->lib, "cudnnDestroyConvolutionDescriptor");
//   d->setMath = dlsym(d->lib, "cudnnSetConvolutionMathType");
//   d->find[0] = dlsym(d->lib, "cudnnFindConvolutionForwardAlgorithmEx");
//   d->find[1] = dlsym(d->lib, "cudnnFindConvolutionBackwardDataAlgorithmEx");
//   d->find[2] = dlsym(d->lib, "cudnnFindConvolutionBackwardFilterAlgorithmEx");
//   d->run[0] = dlsym(d->lib, "cudnnConvolutionForward");
//   d->run[1] = dlsym(d->lib, "cudnnConvolutionBackwardData");
//   d->run[2] = dlsym(d->lib, "cudnnConvolutionBackwardFilter");
//   d->errorString = dlsym(d->lib, "cudnnGetErrorString");
//   void *got[] = {create, setStream, getVersion, d->destroy, d->createTensor, d->setTensor, d->destroyTensor,
//                  d->createFilter, d->setFilter, d->destroyFilter, d->createConv, d->setConv, d->destroyConv, d->setMath,
//                  d->errorString, d->find[0], d->find[1], d->find[2], d->run[0], d->run[1], d->run[2]};
//   const char *names[] = {"cudnnCreate", "cudnnSetStream", "cudnnGetVersion", "cudnnDestroy", "cudnnCreateTensorDescriptor",
//                          "cudnnSetTensor4dDescriptor", "cudnnDestroyTensorDescriptor", "cudnnCreateFilterDescriptor",
//                          "cudnnSetFilter4dDescriptor", "cudnnDestroyFilterDescriptor", "cudnnCreateConvolutionDescriptor",
//                          "cudnnSetConvolution2dDescriptor", "cudnnDestroyConvolutionDescriptor", "cudnnSetConvolutionMathType",
//                          "cudnnGetErrorString", "cudnnFindConvolutionForwardAlgorithmEx",
//                          "cudnnFindConvolutionBackwardDataAlgorithmEx", "cudnnFindConvolutionBackwardFilterAlgorithmEx",
//                          "cudnnConvolutionForward", "cudnnConvolutionBackwardData",
//                          "cudnnConvolutionBackwardFilter"};
//   for (int i = 0; i < (int)(sizeof got / sizeof got[0]); i++)
//     if (got[i] == NULL) { *missing = names[i]; dlclose(d->lib); return -2; }
//   *version = getVersion();
//   int r = create(&d->h);
//   if (r) { dlclose(d->lib); return r; }
//   if ((r = setStream(d->h, s))) { d->destroy(d->h); dlclose(d->lib); return r; }
//   return 0;
// }
// static void rt_dnn_close(dnn *d) { d->destroy(d->h); dlclose(d->lib); }
// static const char *rt_dnn_error(dnn *d, int r) { return d->errorString(r); }
//
// // exact[i][algo]: direction i's algorithms that sum the products as a
// // GEMM does. FFT and Winograd transform the operands and lose digits
// // (errors near 1e-3 of the largest output with 5×5 kernels, as TF32's).
// static const int exact[3][8] = {{1, 1, 1, 1, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}, {1, 1, 0, 1, 0, 0, 0}};
//
// // rt_dnn_plan makes p's descriptors and times every algorithm of each
// // direction on x, w and y (cuDNN's FindEx, with ws of wsBytes as
// // scratch; it runs before any capture), keeping the fastest that ran,
// // is exact and deterministic (or any, when anyAlgo), fits in the
// // workspace and uses tensor cores only when tf32 allows. all[16*i:]
// // gets direction i's timings, got[i] how many. It returns cuDNN's
// // status, or -3 with *dir set when a direction has no such algorithm.
// static int rt_dnn_plan(dnn *d, dnnPlan *p, int n, int c, int h, int w, int k, int out, int pad, int oh, int ow,
//                        int tf32, int anyAlgo, CUdeviceptr x, CUdeviceptr wt, CUdeviceptr y, CUdeviceptr ws, size_t wsBytes,
//                        int *dir, dnnPerf *all, int *gotAll) {
//   int r;
//   *dir = -1;
//   if ((r = d->createTensor(&p->x)) || (r = d->setTensor(p->x, DNN_NCHW, DNN_FLOAT, n, c, h, w))) return r;
//   if ((r = d->createTensor(&p->y)) || (r = d->setTensor(p->y, DNN_NCHW, DNN_FLOAT, n, out, oh, ow))) return r;
//   if ((r = d->createFilter(&p->w)) || (r = d->setFilter(p->w, DNN_FLOAT, DNN_NCHW, out, c, k, k))) return r;
//   for (int i = 0; i < 3; i++) {
//     *dir = i;
//     if ((r = d->createConv(&p->conv[i])) || (r = d->setConv(p->conv[i], pad, pad, 1, 1, 1, 1, DNN_CROSS_CORRELATION, DNN_FLOAT)))
//       return r;
//     if ((r = d->setMath(p->conv[i], tf32 ? DNN_DEFAULT_MATH : DNN_FMA_MATH))) return r;
//     dnnPerf *perf = all + 16 * i;
//     int got = 0;
//     void *a = i == 1 ? p->w : p->x, *b = i == 0 ? p->w : p->y, *o = i == 0 ? p->y : i == 1 ? p->x : p->w;
//     CUdeviceptr da = i == 1 ? wt : x, db = i == 0 ? wt : y, dout = i == 0 ? y : i == 1 ? x : wt;
//     if ((r = d->find[i](d->h, a, (const void *)da, b, (const void *)db, p->conv[i], o, (void *)dout, 16, &got, perf, (void *)ws,
//                         wsBytes))) return r;
//     gotAll[i] = got;
//     int pick = -1;
//     for (int j = 0; j < got && pick < 0; j++) {
//       int m = perf[j].mathType, al = perf[j].algo;
//       int ok = anyAlgo || (perf[j].determinism == DNN_DETERMINISTIC && al >= 0 && al < 8 && exact[i][al]);
//       if (perf[j].status == 0 && ok && perf[j].memory <= wsBytes && (tf32 ? m != DNN_ALLOW_CONVERSION : m == DNN_FMA_MATH))
//         pick = j;
//     }
//     if (pick < 0) return -3;
//     p->algo[i] = perf[pick].algo;
//     p->ws[i] = perf[pick].memory;
//     if (tf32 && (r = d->setMath(p->conv[i], perf[pick].mathType))) return r;
//   }
//   *dir = -1;
//   return 0;
// }
// static void rt_dnn_free_plan(dnn *d, dnnPlan *p) {
//   if (p->x) d->destroyTensor(p->x);
//   if (p->y) d->destroyTensor(p->y);
//   if (p->w) d->destroyFilter(p->w);
//   for (int i = 0; i < 3; i++) if (p->conv[i]) d->destroyConv(p->conv[i]);
// }
// // rt_dnn_run runs direction i of p: out = conv(a, b), beta 0.
// static int rt_dnn_run(dnn *d, dnnPlan *p, int i, CUdeviceptr a, CUdeviceptr b, CUdeviceptr out, CUdeviceptr ws, size_t wsBytes) {
//   float one = 1.f, zero = 0.f;
//   void *da = i == 1 ? p->w : p->x, *db = i == 0 ? p->w : p->y, *dout = i == 0 ? p->y : i == 1 ? p->x : p->w;
//   return d->run[i](d->h, &one, da, (const void *)a, db, (const void *)b, p->conv[i], p->algo[i], (void *)ws, wsBytes, &zero,
//                    dout, (void *)out);
// }
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unsafe"
)

// dnnState is CUDA's cuDNN: the library and handle, the plans made, and
// one workspace for all of them (a step runs one convolution at a time).
type dnnState struct {
	lib     C.dnn
	ok      bool
	note    string // which library, or why none
	tf32    bool
	anyAlgo bool // CUDAOptions.AnyConvAlgo
	// report is, per plan, cuDNN's timing of every algorithm it tried
	// and which was kept (ConvReport).
	report  []string
	ws      C.CUdeviceptr
	wsBytes C.size_t
	plans   []C.dnnPlan
	// gemm is, per plan, the shape whose weights' gradient im2col and one
	// GEMM compute in place of cuDNN's filter algorithm (zero Conv: cuDNN).
	gemm []filterGEMM
}

// filterGEMM is a plan's weights' gradient by im2col and one GEMM, with
// the scratch buffers it runs in.
type filterGEMM struct {
	g          Conv
	out, batch int
	col, t     Buf
}

// dnnMaxWorkspace bounds one algorithm's workspace: cuDNN's fastest
// convolutions may ask for GiBs, a few percent faster than ones that need
// tens of MiB.
const dnnMaxWorkspace = 512 << 20

// convDirections name the three directions of a plan in errors.
var convDirections = [3]string{"forward", "backward data", "backward filter"}

// openDNN loads cuDNN, when it can be found: RINGTRAIN_CUDNN (a path, or
// "off"), else libcudnn.so.9 or .8 on the loader's path or in the CUDA
// install folders. Without it the convolutions stay im2col and cuBLAS;
// c.dnn.note says which it is.
func (c *CUDA) openDNN() {
	var tries []string
	switch p := os.Getenv("RINGTRAIN_CUDNN"); p {
	case "off":
		c.dnn.note = "cuDNN off (RINGTRAIN_CUDNN=off)"
		return
	case "":
		globbed, _ := filepath.Glob("/usr/local/cuda*/targets/x86_64-linux/lib")
		for _, major := range []string{"9", "8"} {
			tries = append(tries, "libcudnn.so."+major)
			for _, d := range append([]string{"/usr/local/cuda/lib64"}, globbed...) {
				if p := filepath.Join(d, "libcudnn.so."+major); fileExists(p) {
					tries = append(tries, p)
				}
			}
		}
	default:
		tries = []string{p}
	}
	var why []string
	for _, p := range tries {
		cp := C.CString(p)
		var version C.size_t
		var missing *C.char
		r := C.rt_dnn_open(&c.dnn.lib, cp, c.stream, &version, &missing)
		C.free(unsafe.Pointer(cp))
		switch r {
		case 0:
			c.dnn.ok = true
			c.dnn.note = fmt.Sprintf("%s (cuDNN %d)", p, int(version))
			if c.dnn.anyAlgo {
				c.dnn.note += ", any algorithm (--conv-algos any)"
			}
			return
		case -1:
			why = append(why, p+": "+dlerror())
		case -2:
			why = append(why, p+": lacks "+C.GoString(missing))
		default:
			why = append(why, fmt.Sprintf("%s: cudnnCreate: status %d", p, int(r)))
		}
	}
	c.dnn.note = "no cuDNN, convolutions by im2col and cuBLAS (" + joinWhy(why) + ")"
}

func joinWhy(why []string) string {
	if len(why) > 2 {
		why = append(why[:2], fmt.Sprintf("%d more", len(why)-2))
	}
	return strings.Join(why, "; ")
}

// DNN says which cuDNN convolves, or why none does.
func (c *CUDA) DNN() string { return c.dnn.note }

var errNoDNN = errors.New("no cuDNN")

func (c *CUDA) dnnError(r C.int, what string) error {
	if r == -3 {
		kind := "exact, deterministic algorithm"
		if c.dnn.anyAlgo {
			kind = "algorithm"
		}
		return fmt.Errorf("engine: cuDNN %s: no %s within %d MiB of workspace", what, kind, dnnMaxWorkspace>>20)
	}
	return fmt.Errorf("engine: cuDNN %s: %s (status %d)", what, C.GoString(C.rt_dnn_error(&c.dnn.lib, r)), int(r))
}

// ConvPlan times cuDNN's algorithms for the shape, keeps the fastest
// exact and deterministic ones and grows the shared workspace to fit
// them; it runs before any step is captured.
func (c *CUDA) ConvPlan(g Conv, out, batch int) (int, error) {
	if !c.dnn.ok {
		return 0, errNoDNN
	}
	var p C.dnnPlan
	var fg filterGEMM
	// FindEx times the algorithms on buffers of ours, zeroed, rather than
	// on scratch of cuDNN's that nothing wrote; the last two are im2col's
	// columns and the channel-major dy, to time the GEMM way in.
	sizes := []int{batch * g.C * g.H * g.W, out * g.ColRows(), batch * out * g.ColCols(), dnnMaxWorkspace / 4,
		g.ColRows() * batch * g.ColCols(), out * batch * g.ColCols()}
	err := c.on(func() error {
		var tmp []C.CUdeviceptr
		defer func() {
			for _, b := range tmp {
				C.cuMemFree(b)
			}
		}()
		for _, n := range sizes {
			var b C.CUdeviceptr
			if err := cuErr(C.cuMemAlloc(&b, C.size_t(4*n)), fmt.Sprintf("%.1f MiB to time cuDNN's algorithms in", mib(4*int64(n)))); err != nil {
				return err
			}
			tmp = append(tmp, b)
			if err := cuErr(C.cuMemsetD32(b, 0, C.size_t(n)), "zeroing"); err != nil {
				return err
			}
		}
		var dir C.int
		var all [3 * 16]C.dnnPerf
		var got [3]C.int
		r := C.rt_dnn_plan(&c.dnn.lib, &p, C.int(batch), C.int(g.C), C.int(g.H), C.int(g.W), C.int(g.K), C.int(out), C.int(g.Pad),
			C.int(g.OH), C.int(g.OW), boolInt(c.dnn.tf32), boolInt(c.dnn.anyAlgo), tmp[0], tmp[1], tmp[2], tmp[3], dnnMaxWorkspace, &dir,
			&all[0], &got[0])
		if r != 0 {
			what := "describing the convolution"
			if dir >= 0 {
				what = "choosing the " + convDirections[dir] + " algorithm"
			}
			C.rt_dnn_free_plan(&c.dnn.lib, &p)
			return c.dnnError(r, fmt.Sprintf("%s of %d×%d×%d by %d %d×%d kernels at batch %d", what, g.C, g.H, g.W, out, g.K, g.K, batch))
		}
		var err error
		if fg, err = c.chooseFilter(&p, g, out, batch, tmp); err != nil {
			C.rt_dnn_free_plan(&c.dnn.lib, &p)
			return err
		}
		c.dnn.report = append(c.dnn.report, planReport(g, out, batch, &p, all[:], got[:], fg.batch > 0))
		need := max(p.ws[0], p.ws[1], p.ws[2])
		if fg.batch > 0 {
			need = max(p.ws[0], p.ws[1])
		}
		if need <= c.dnn.wsBytes {
			return nil
		}
		if c.dnn.ws != 0 {
			if err := cuErr(C.cuMemFree(c.dnn.ws), "freeing cuDNN's workspace"); err != nil {
				return err
			}
			c.dnn.ws, c.dnn.wsBytes = 0, 0
		}
		if err := cuErr(C.cuMemAlloc(&c.dnn.ws, need), fmt.Sprintf("cuDNN's workspace of %.1f MiB", mib(int64(need)))); err != nil {
			C.rt_dnn_free_plan(&c.dnn.lib, &p)
			return err
		}
		c.dnn.wsBytes = need
		return nil
	})
	if err != nil {
		return 0, err
	}
	c.dnn.plans = append(c.dnn.plans, p)
	c.dnn.gemm = append(c.dnn.gemm, fg)
	return len(c.dnn.plans) - 1, nil
}

// planReport is one line a direction: the algorithm kept, then every
// algorithm cuDNN timed (number, ms, d for deterministic, t for tensor
// cores, ! where it failed).
func planReport(g Conv, out, batch int, p *C.dnnPlan, all []C.dnnPerf, got []C.int, filterByGEMM bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d×%d×%d by %d %d×%d kernels, batch %d:", g.C, g.H, g.W, out, g.K, g.K, batch)
	for i := range 3 {
		kept := fmt.Sprint(int(p.algo[i]))
		if i == 2 && filterByGEMM {
			kept = "im2col+GEMM"
		}
		fmt.Fprintf(&b, "\n  %s: kept %s; timed", convDirections[i], kept)
		for _, pf := range all[16*i : 16*i+int(got[i])] {
			flags := ""
			if pf.determinism == C.DNN_DETERMINISTIC {
				flags += "d"
			}
			if pf.mathType != C.DNN_FMA_MATH {
				flags += "t"
			}
			if pf.status != 0 {
				flags += "!"
			}
			fmt.Fprintf(&b, " %d:%.3f%s", int(pf.algo), float64(pf.time), flags)
		}
	}
	return b.String()
}

// ConvReport is cuDNN's timing of every algorithm for each plan made, and
// which was kept.
func (c *CUDA) ConvReport() string { return strings.Join(c.dnn.report, "\n") }

// chooseFilter times the weights' gradient of p by cuDNN's algorithm and
// by im2col and one GEMM (tmp: x, w, dy, workspace, columns, channel-major
// dy) and returns the GEMM's shape and scratch if it is the faster:
// cuDNN's exact, deterministic filter algorithms lose to it on some
// shapes (both of the cnn's layers at batch 256 on an H200, in FP32).
// RINGTRAIN_CUDNN_FILTER=gemm or cudnn decides instead of the clock.
func (c *CUDA) chooseFilter(p *C.dnnPlan, g Conv, out, batch int, tmp []C.CUdeviceptr) (filterGEMM, error) {
	n := func(i int) int {
		return []int{batch * g.C * g.H * g.W, 0, batch * out * g.ColCols(), 0, g.ColRows() * batch * g.ColCols(), out * batch * g.ColCols()}[i]
	}
	x, dy, dw := devBuf{tmp[0], n(0)}, devBuf{tmp[2], n(2)}, devBuf{tmp[1], out * g.ColRows()}
	byDNN := func() error {
		if r := C.rt_dnn_run(&c.dnn.lib, p, 2, tmp[0], tmp[2], tmp[1], tmp[3], dnnMaxWorkspace); r != 0 {
			return c.dnnError(r, "backward filter")
		}
		return nil
	}
	fg := filterGEMM{g: g, out: out, batch: batch, col: devBuf{tmp[4], n(4)}, t: devBuf{tmp[5], n(5)}}
	byGEMM := func() error { return c.filterByGEMM(fg, x, dy, dw) }
	useGEMM := false
	switch os.Getenv("RINGTRAIN_CUDNN_FILTER") {
	case "gemm":
		useGEMM = true
	case "cudnn":
	default:
		td, err := c.timeCalls(byDNN)
		if err != nil {
			return filterGEMM{}, err
		}
		tg, err := c.timeCalls(byGEMM)
		if err != nil {
			return filterGEMM{}, err
		}
		useGEMM = tg < td
	}
	if !useGEMM {
		return filterGEMM{}, nil
	}
	var err error
	if fg.col, err = c.scratch(n(4)); err != nil {
		return filterGEMM{}, err
	}
	if fg.t, err = c.scratch(n(5)); err != nil {
		return filterGEMM{}, err
	}
	return fg, nil
}

// timeCalls is the least of three timings of f, each run alone after a
// first call that warms it up.
func (c *CUDA) timeCalls(f func() error) (time.Duration, error) {
	best := time.Duration(math.MaxInt64)
	for i := range 4 {
		start := time.Now()
		if err := errors.Join(f(), c.Sync()); err != nil {
			return 0, err
		}
		if i > 0 {
			best = min(best, time.Since(start))
		}
	}
	return best, nil
}

// filterByGEMM is the im2col path's weights' gradient: x's columns, dy
// channel-major, and one GEMM that sums over the batch.
func (c *CUDA) filterByGEMM(fg filterGEMM, x, dy, dw Buf) error {
	P := fg.g.ColCols()
	if err := c.Im2colBatch(x, fg.col, fg.g, fg.batch); err != nil {
		return err
	}
	if err := c.Rebatch(dy, fg.t, fg.batch, fg.out, P); err != nil {
		return err
	}
	return c.Gemm(false, true, fg.out, fg.g.ColRows(), fg.batch*P, fg.t, fg.col, 0, dw)
}

func (c *CUDA) convRun(plan, dir int, a, b, out Buf) error {
	if plan < 0 || plan >= len(c.dnn.plans) {
		return fmt.Errorf("engine: convolution plan %d of %d", plan, len(c.dnn.plans))
	}
	p := &c.dnn.plans[plan]
	return c.on(func() error {
		if r := C.rt_dnn_run(&c.dnn.lib, p, C.int(dir), dev(a).p, dev(b).p, dev(out).p, c.dnn.ws, c.dnn.wsBytes); r != 0 {
			return c.dnnError(r, convDirections[dir])
		}
		return nil
	})
}

func (c *CUDA) ConvForward(plan int, x, w, y Buf) error { return c.convRun(plan, 0, x, w, y) }

func (c *CUDA) ConvBackwardData(plan int, w, dy, dx Buf) error { return c.convRun(plan, 1, w, dy, dx) }

func (c *CUDA) ConvBackwardFilter(plan int, x, dy, dw Buf) error {
	if plan >= 0 && plan < len(c.dnn.gemm) && c.dnn.gemm[plan].batch > 0 {
		return c.filterByGEMM(c.dnn.gemm[plan], x, dy, dw)
	}
	return c.convRun(plan, 2, x, dy, dw)
}

// closeDNN frees the plans, the workspace and the handle.
func (c *CUDA) closeDNN() error {
	if !c.dnn.ok {
		return nil
	}
	for i := range c.dnn.plans {
		C.rt_dnn_free_plan(&c.dnn.lib, &c.dnn.plans[i])
	}
	c.dnn.plans, c.dnn.gemm, c.dnn.report = nil, nil, nil
	var err error
	if c.dnn.ws != 0 {
		err = cuErr(C.cuMemFree(c.dnn.ws), "freeing cuDNN's workspace")
		c.dnn.ws, c.dnn.wsBytes = 0, 0
	}
	C.rt_dnn_close(&c.dnn.lib)
	c.dnn.ok = false
	return err
}

var _ convolver = (*CUDA)(nil)
