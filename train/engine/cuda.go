//go:build ringtrain_cuda

package engine

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"gorgonia.org/cu"
	cublas "gorgonia.org/cu/blas"

	"github.com/ringtrain/ringtrain/train/engine/ptx"
)

// The tag is ringtrain_cuda, not cuda: with cuda, gorgonia itself switches
// to its own CUDA engine, which imports cuDNN (gorgonia.org/cu/dnn) and does
// not build here.
//
// This file has NOT run on a GPU: no machine it was written on has one. It
// is compiled and vetted in CI against CUDA 11.8's headers and stub
// libraries (make cuda-check); the logic it drives is Net's, tested with
// Host, and its kernels are threads.go's bodies, tested there.

// ErrNoDevice means there is no CUDA device to run on.
var ErrNoDevice = errors.New("engine: no CUDA device found")

// CUDA is Ops on an NVIDIA GPU through gorgonia.org/cu: cuBLAS for Gemm
// and the kernels of package ptx for the rest. Each call makes the context
// current on a locked OS thread, since a CUDA context belongs to a thread
// and goroutines move between threads.
type CUDA struct {
	name string
	ctx  cu.CUContext
	mod  cu.Module
	fns  map[string]cu.Function
	bl   *cublas.Standard
	mem  []cu.DevicePtr
}

type devBuf struct {
	p cu.DevicePtr
	n int
}

func (b devBuf) Len() int { return b.n }

func dev(b Buf) devBuf { return b.(devBuf) }

// NewCUDA opens device ordinal, loads the kernels and starts cuBLAS.
func NewCUDA(ordinal int) (_ *CUDA, err error) {
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
	c := &CUDA{name: fmt.Sprintf("cuda:%d (%s)", ordinal, name), fns: map[string]cu.Function{}}
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
	if c.mod, err = cu.LoadData(ptx.Module); err != nil {
		return nil, fmt.Errorf("engine: loading the kernels' PTX: %w", err)
	}
	for k := range ptx.Kernels {
		if c.fns[k], err = c.mod.Function(k); err != nil {
			return nil, fmt.Errorf("engine: kernel %s: %w", k, err)
		}
	}
	c.bl = cublas.New()
	return c, nil
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

func (c *CUDA) Name() string { return c.name }

func (c *CUDA) Alloc(n int) (Buf, error) {
	var p cu.DevicePtr
	err := c.on(func() (err error) {
		if p, err = cu.MemAlloc(int64(4 * max(n, 1))); err != nil {
			return err
		}
		return cu.MemsetD32(p, 0, int64(max(n, 1)))
	})
	if err != nil {
		return nil, fmt.Errorf("engine: %d floats on %s: %w", n, c.name, err)
	}
	c.mem = append(c.mem, p)
	return devBuf{p, n}, nil
}

func (c *CUDA) Slice(b Buf, off, n int) Buf {
	d := dev(b)
	if off < 0 || n < 0 || off+n > d.n {
		panic(fmt.Sprintf("engine: slice [%d:%d] of a %d-float buffer", off, off+n, d.n)) // a bug in Net, not input
	}
	return devBuf{d.p + cu.DevicePtr(4*off), n}
}

func (c *CUDA) Upload(dst Buf, src []float32) error {
	d := dev(dst)
	if d.n != len(src) {
		return fmt.Errorf("engine: upload of %d values into %d", len(src), d.n)
	}
	if d.n == 0 {
		return nil
	}
	return c.on(func() error { return cu.MemcpyHtoD(d.p, unsafe.Pointer(&src[0]), int64(4*d.n)) })
}

func (c *CUDA) Download(dst []float32, src Buf) error {
	s := dev(src)
	if s.n != len(dst) {
		return fmt.Errorf("engine: download of %d values into %d", s.n, len(dst))
	}
	if s.n == 0 {
		return nil
	}
	return c.on(func() error { return cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), s.p, int64(4*s.n)) })
}

// devSlice dresses a device address as a []float32 for cuBLAS's Go API,
// which takes &s[0] as the matrix's address; the slice is never read by
// Go. (Reading the address out of p's memory keeps vet's
// unsafe-pointer check satisfied: this is not Go memory.)
func devSlice(b devBuf) []float32 {
	return unsafe.Slice((*float32)(*(*unsafe.Pointer)(unsafe.Pointer(&b.p))), max(b.n, 1))
}

// Gemm is row-major; cuBLAS is column-major, and a row-major matrix is its
// transpose in column-major, so C = A·B is computed as Cᵀ = Bᵀ·Aᵀ with
// the operands swapped and the leading dimensions unchanged.
func (c *CUDA) Gemm(transA, transB bool, m, n, k int, a, b Buf, beta float32, out Buf) error {
	ta, tb, lda, ldb := gemmArgs(transA, transB, m, n, k)
	return c.on(func() error {
		c.bl.Sgemm(tb, ta, n, m, k, 1, devSlice(dev(b)), ldb, devSlice(dev(a)), lda, beta, devSlice(dev(out)), n)
		return c.bl.Err()
	})
}

// launch runs kernel name over n threads with the given arguments, each
// widened to the 64-bit word gorgonia.org/cu passes.
func (c *CUDA) launch(name string, n int, args ...any) error {
	if want := ptx.Kernels[name]; want != len(args) {
		return fmt.Errorf("engine: kernel %s takes %d arguments, given %d", name, want, len(args))
	}
	if n <= 0 {
		return nil
	}
	words := make([]uint64, len(args))
	ptrs := make([]unsafe.Pointer, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case Buf:
			words[i] = uint64(dev(v).p)
		case int:
			words[i] = uint64(int64(v))
		default:
			return fmt.Errorf("engine: kernel %s argument %d is a %T", name, i, a)
		}
		ptrs[i] = unsafe.Pointer(&words[i])
	}
	grid, block := Launch(n)
	return c.on(func() error {
		return c.fns[name].LaunchAndSync(grid, 1, 1, block, 1, 1, 0, cu.NoStream, ptrs)
	})
}

func (c *CUDA) Im2col(x, col Buf, g Conv) error {
	return c.launch("im2col", g.ColRows()*g.ColCols(), x, col, g.C, g.H, g.W, g.K, g.Pad, g.OH, g.OW)
}

func (c *CUDA) Col2im(col, dx Buf, g Conv) error {
	return c.launch("col2im", g.C*g.H*g.W, col, dx, g.C, g.H, g.W, g.K, g.Pad, g.OH, g.OW)
}

func (c *CUDA) BiasAdd(y, b Buf, rows, cols, inner int) error {
	return c.launch("bias_add", rows*cols*inner, y, b, rows*cols*inner, cols, inner)
}

func (c *CUDA) BiasGrad(dy, db Buf, rows, cols, inner int) error {
	return c.launch("bias_grad", cols, dy, db, rows, cols, inner)
}

func (c *CUDA) Relu(x, y Buf) error { return c.launch("relu", x.Len(), x, y, x.Len()) }

func (c *CUDA) ReluBackward(y, dy, dx Buf) error {
	return c.launch("relu_backward", y.Len(), y, dy, dx, y.Len())
}

func (c *CUDA) MaxPool(x, y Buf, g Pool) error {
	return c.launch("max_pool", g.Planes*g.OH*g.OW, x, y, g.Planes, g.H, g.W, g.K, g.OH, g.OW)
}

func (c *CUDA) MaxPoolBackward(x, dy, dx Buf, g Pool) error {
	return c.launch("max_pool_backward", g.Planes*g.H*g.W, x, dy, dx, g.Planes, g.H, g.W, g.K, g.OH, g.OW)
}

func (c *CUDA) SoftmaxXent(logits, labels, grad, loss Buf, rows, n, classes int) error {
	return c.launch("softmax_xent", rows, logits, labels, grad, loss, rows, n, classes)
}

// Close frees every buffer, cuBLAS, the kernels and the context.
func (c *CUDA) Close() error {
	return c.on(func() error {
		var errs []error
		for _, p := range c.mem {
			errs = append(errs, cu.MemFree(p))
		}
		c.mem = nil
		errs = append(errs, c.bl.Close(), c.mod.Unload(), c.ctx.Destroy())
		return errors.Join(errs...)
	})
}
