package train

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/ringtrain/ringtrain/ring"
)

// constGrads is a model of one tensor whose gradient is always grad.
type constGrads struct {
	params, grads [][]float32
	grad          []float32
}

func newConstGrads(grad []float32) *constGrads {
	return &constGrads{params: [][]float32{make([]float32, len(grad))}, grads: [][]float32{make([]float32, len(grad))}, grad: grad}
}

func (m *constGrads) ForwardBackward(x []float32, y []int, n int) (float32, error) {
	copy(m.grads[0], m.grad)
	return 0, nil
}
func (m *constGrads) Forward(x []float32, y []int, n int) (float32, error) { return 0, nil }
func (m *constGrads) Params() [][]float32                                  { return m.params }
func (m *constGrads) Grads() [][]float32                                   { return m.grads }
func (m *constGrads) ParamNames() []string                                 { return []string{"w"} }
func (m *constGrads) Logits() []float32                                    { return nil }
func (m *constGrads) Close() error                                         { return nil }

// TestErrorFeedback: with int8 on the wire, a gradient component far below
// its block's largest rounds to zero at every step; error feedback carries
// it over until it adds up to a step, so the parameter moves as it would
// with float32 gradients (to one step of the block's scale). Without
// feedback it would not move at all. Every rank ends with the same bits,
// and int8 counts about a quarter of float32's bytes.
func TestErrorFeedback(t *testing.T) {
	const n, steps = 2, 100
	grad := make([]float32, 64*ring.I8Block) // large enough that headers hardly count
	for i := range grad {
		grad[i] = 0.001 // 0.127 of a step of 1/127: rounds to zero alone
	}
	grad[0] = 1
	sent := map[ring.Encoding]int64{}
	params := make([][]float32, n)
	for _, wire := range []ring.Encoding{ring.F32, ring.I8} {
		rings := memRings(t, n)
		err := onAll(n, func(i int) error {
			rep := NewReplica(newConstGrads(grad), &SGD{LR: 1}, rings[i])
			rep.Wire = wire
			for range steps {
				if _, err := rep.Step(context.Background(), nil, nil, 1); err != nil {
					return err
				}
			}
			params[i] = slices.Clone(rep.Model.Params()[0])
			if i == 0 {
				sent[wire] = rep.Stats.BytesSent
			}
			return nil
		})
		if err != nil {
			t.Fatalf("%v: %v", wire, err)
		}
		if !slices.Equal(params[0], params[1]) {
			t.Errorf("%v: the ranks' parameters differ", wire)
		}
	}
	if got, want := params[0][1], float32(-steps*0.001); math.Abs(float64(got-want)) > 1.0/127 {
		t.Errorf("with int8 and error feedback a gradient of 0.001 moved its parameter to %v in %d steps; want %v (±1/127)", got, steps, want)
	}
	if got := params[0][0]; got != -steps {
		t.Errorf("the block's largest moved to %v; want %v", got, -steps)
	}
	if r := float64(sent[ring.I8]) / float64(sent[ring.F32]); r > 0.3 {
		t.Errorf("int8 counted %d bytes, float32 %d (%.2f); want about a quarter", sent[ring.I8], sent[ring.F32], r)
	}
}
