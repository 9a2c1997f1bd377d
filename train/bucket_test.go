package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ringtrain/ringtrain/ring"
)

// layeredFake is a Layered model of one tensor per layer, each with a
// constant gradient; gate, if set, runs before backward finishes layer i.
type layeredFake struct {
	constGrads
	sizes []int
	gate  func(layer int) error
}

func newLayeredFake(sizes []int, grad func(i int) float32) *layeredFake {
	m := &layeredFake{sizes: sizes}
	for i, n := range sizes {
		g := make([]float32, n)
		for j := range g {
			g[j] = grad(i) * float32(1+j%7)
		}
		m.params = append(m.params, make([]float32, n))
		m.grads = append(m.grads, make([]float32, n))
		m.grad = append(m.grad, g...)
	}
	return m
}

func (m *layeredFake) ParamNames() []string {
	var names []string
	for i := range m.sizes {
		names = append(names, "w"+string(rune('0'+i)))
	}
	return names
}

func (m *layeredFake) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	o := 0
	for i, g := range m.grads {
		if m.gate != nil {
			if err := m.gate(len(m.sizes) - 1 - i); err != nil {
				return 0, err
			}
		}
		copy(g, m.grad[o:])
		o += len(g)
	}
	return 0, nil
}

func (m *layeredFake) offsets() []int {
	off := []int{0}
	for _, n := range m.sizes {
		off = append(off, off[len(off)-1]+n)
	}
	return off
}

func (m *layeredFake) ForwardBackwardLayers(x []float32, y []int, n int, flat []float32, ready func(lo int) error) (float32, error) {
	off := m.offsets()
	for i := len(m.sizes) - 1; i >= 0; i-- {
		if m.gate != nil {
			if err := m.gate(i); err != nil {
				return 0, err
			}
		}
		copy(flat[off[i]:off[i+1]], m.grad[off[i]:off[i+1]])
		if err := ready(off[i]); err != nil {
			return 0, err
		}
	}
	return 0, nil
}

// started is a Collective that closes began when its first allreduce
// begins.
type started struct {
	*ring.Ring
	once  *sync.Once
	began chan struct{}
}

func newStarted(r *ring.Ring) started {
	return started{Ring: r, once: new(sync.Once), began: make(chan struct{})}
}

func (s started) AllreduceMean(ctx context.Context, buf []float32) error {
	s.once.Do(func() { close(s.began) })
	return s.Ring.AllreduceMean(ctx, buf)
}

func (s started) AllreduceMeanAs(ctx context.Context, buf []float32, enc ring.Encoding) error {
	s.once.Do(func() { close(s.began) })
	return s.Ring.AllreduceMeanAs(ctx, buf, enc)
}

// TestBucketPlan: buckets are whole layers, last first, the first closed
// at FirstBucketBytes and the rest at BucketBytes; one bucket is no plan.
func TestBucketPlan(t *testing.T) {
	for _, tc := range []struct {
		name   string
		sizes  []int
		bucket int
		want   [][2]int
	}{
		{"every layer its own", []int{10, 20, 30}, 4, [][2]int{{30, 60}, {10, 30}, {0, 10}}},
		{"layers gathered", []int{10, 20, 30, 5}, 4 * 35, [][2]int{{30, 65}, {0, 30}}},
		{"the first bucket small", []int{1 << 20, 1 << 18, 10}, 25 << 20, [][2]int{{1 << 20, 1<<20 + 1<<18 + 10}, {0, 1 << 20}}},
		{"one bucket: no plan", []int{10, 20}, 1 << 20, nil},
		{"off", []int{10, 20}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := NewReplica(newLayeredFake(tc.sizes, func(int) float32 { return 1 }), &SGD{LR: 1}, memRings(t, 2)[0])
			rep.BucketBytes = tc.bucket
			if _, err := rep.buffer(); err != nil {
				t.Fatal(err)
			}
			if got := rep.bucketPlan(); !slices.Equal(got, tc.want) {
				t.Errorf("plan = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestOverlappedStep: with buckets, the ring starts on the last layers'
// gradients while backward has yet to finish the first layer (the fake's
// first layer waits for it, which without overlap would never come), and
// the step applies what the plain path applies — to float rounding, as the
// ring adds each element in an order set by its segment — the same bits on
// every rank, with float32 and with int8 on the wire.
func TestOverlappedStep(t *testing.T) {
	const n, steps = 3, 3
	sizes := []int{300, 200, 100}
	for _, wire := range []ring.Encoding{ring.F32, ring.I8} {
		params := map[int][][]float32{}
		for _, bucket := range []int{0, 4} {
			rings := memRings(t, n)
			params[bucket] = make([][]float32, n)
			err := onAll(n, func(i int) error {
				m := newLayeredFake(sizes, func(layer int) float32 { return float32(i+1) / float32(layer+1) })
				coll := newStarted(rings[i])
				gate := func(layer int) error {
					if layer != 0 {
						return nil
					}
					select { // the ring must have begun before the first layer is done
					case <-coll.began:
						return nil
					case <-time.After(10 * time.Second):
						return errors.New("backward reached the first layer and no allreduce had begun")
					}
				}
				if bucket > 0 {
					m.gate = gate
				}
				rep := NewReplica(m, &SGD{LR: 0.1}, coll)
				rep.Wire, rep.BucketBytes = wire, bucket
				// A rank whose gate fails leaves the others in a collective:
				// the deadline ends theirs too.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				for range steps {
					if _, err := rep.Step(ctx, nil, nil, 1); err != nil {
						return err
					}
				}
				params[bucket][i] = slices.Concat(rep.Model.Params()...)
				return nil
			})
			if err != nil {
				t.Fatalf("%v, buckets of %d bytes: %v", wire, bucket, err)
			}
			for i := 1; i < n; i++ {
				if !slices.Equal(params[bucket][i], params[bucket][0]) {
					t.Errorf("%v: rank %d's parameters differ from rank 0's", wire, i)
				}
			}
		}
		// int8's blocks start at each bucket's start, so it rounds other
		// blocks: within its error, lr × steps × (n+1) hops × half a step
		// of the largest block's scale (mean gradient up to 14).
		tol := 1e-6
		if wire == ring.I8 {
			tol = 0.1 * steps * (n + 1) * 14.0 / 254
		}
		for j, want := range params[0][0] {
			if got := params[4][0][j]; math.Abs(float64(got-want)) > tol*max(1, math.Abs(float64(want))) {
				t.Fatalf("%v: parameter %d = %v with buckets, %v without", wire, j, got, want)
			}
		}
	}
}

// TestOverlappedNaN: a NaN in one rank's earliest bucket — sent after the
// others have gone round — still makes every rank skip the step, and that
// rank names the tensor; nothing is applied anywhere. The same where the
// model hands its gradients over whole (they are checked as gathered).
func TestOverlappedNaN(t *testing.T) {
	for _, layered := range []bool{true, false} {
		const n = 3
		rings := memRings(t, n)
		errs := make([]error, n)
		params := make([][]float32, n)
		onAll(n, func(i int) error {
			m := newLayeredFake([]int{300, 200, 100}, func(int) float32 { return 1 })
			if i == 1 {
				m.grad[5] = float32(math.NaN())
			}
			var model Model = m
			if !layered { // gradients whole after backward, as gorgonia's
				model = struct{ Model }{m}
			}
			rep := NewReplica(model, &SGD{LR: 0.1}, rings[i])
			rep.BucketBytes = 4
			_, errs[i] = rep.Step(context.Background(), nil, nil, 1)
			params[i] = slices.Concat(rep.Model.Params()...)
			return nil
		})
		for i, err := range errs {
			if !errors.Is(err, ErrNonFinite) {
				t.Fatalf("layered %v: rank %d: %v; want ErrNonFinite", layered, i, err)
			}
			if slices.ContainsFunc(params[i], func(v float32) bool { return v != 0 }) {
				t.Errorf("layered %v: rank %d applied the step", layered, i)
			}
		}
		if !strings.Contains(errs[1].Error(), "w0 gradient") {
			t.Errorf("layered %v: rank 1: %v; want it to name w0", layered, errs[1])
		}
	}
}

// spans is a Tracer that keeps what it is told.
type spans struct {
	mu  sync.Mutex
	got []string
}

func (s *spans) Span(name string, start, end time.Time, step, bucket int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if end.Before(start) {
		name += " (ends before it starts)"
	}
	s.got = append(s.got, fmt.Sprintf("%d %s %d", step, name, bucket))
}

// A traced step reports each phase once: the computation, every bucket's
// allreduce (or the one allreduce), the optimizer; a graph model's
// forward and backward apart.
func TestStepTrace(t *testing.T) {
	const n = 2
	for _, tc := range []struct {
		name   string
		bucket int
		want   []string
	}{
		{"one allreduce", 0, []string{"1 forward+backward -1", "1 allreduce -1", "1 optimizer -1"}},
		// Three buckets of gradients, then the step's trailer.
		{"buckets", 4, []string{"1 forward+backward -1", "1 allreduce 0", "1 allreduce 1", "1 allreduce 2", "1 allreduce 3", "1 optimizer -1"}},
	} {
		rings := memRings(t, n)
		traces := make([]*spans, n)
		err := onAll(n, func(i int) error {
			rep := NewReplica(newLayeredFake([]int{300, 200, 100}, func(int) float32 { return 1 }), &SGD{LR: 0.1}, rings[i])
			rep.BucketBytes, traces[i] = tc.bucket, &spans{}
			rep.Trace = traces[i]
			_, err := rep.Step(context.Background(), nil, nil, 1)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for i, tr := range traces {
			got := slices.DeleteFunc(tr.got, func(s string) bool { return strings.Contains(s, " wait ") })
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Errorf("%s, rank %d: %q; want %q", tc.name, i, got, want)
			}
		}
	}
	// A graph model: forward, then backward.
	m, err := NewModel(ModelConfig{Spec: MLPSpec(8, []int{4}, 3), Batch: 2, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tr := &spans{}
	rep := NewReplica(m, &SGD{LR: 0.1}, memRings(t, 1)[0])
	rep.Trace = tr
	if _, err := rep.Step(context.Background(), make([]float32, 16), []int{0, 2}, 2); err != nil {
		t.Fatal(err)
	}
	if want := []string{"1 forward -1", "1 backward -1", "1 allreduce -1", "1 optimizer -1"}; !slices.Equal(tr.got, want) {
		t.Errorf("graph model: %q; want %q", tr.got, want)
	}
}
