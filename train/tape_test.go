package train

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	G "gorgonia.org/gorgonia"
)

// TestTapeMatchesTapeMachine: the tape computes what gorgonia's
// TapeMachine computes from the same graph — the loss and every
// gradient, bit for bit — on the mlp, the cnn and a net with a residual
// connection, dropout and tanh (gorgonia's own ops among ours).
func TestTapeMatchesTapeMachine(t *testing.T) {
	mlp, _ := BuiltinSpec("mlp", 1, 28, 28, 10)
	cnn, _ := BuiltinSpec("cnn", 1, 28, 28, 10)
	res := Spec{Input: []int{784}, Layers: []Layer{
		{Type: LayerLinear, Out: 32}, {Type: LayerReLU, Save: "a"}, {Type: LayerLinear, Out: 32},
		{Type: LayerAdd, From: "a"}, {Type: LayerDropout, P: 0.3}, {Type: LayerTanh}, {Type: LayerLinear, Out: 10}}}
	for name, spec := range map[string]Spec{"mlp": mlp, "cnn": cnn, "residual": res} {
		t.Run(name, func(t *testing.T) {
			const batch = 4
			mod, err := NewModel(ModelConfig{Spec: spec, Batch: batch, Seed: 5})
			if err != nil {
				t.Fatal(err)
			}
			m := mod.(*graphModel)
			m.SeedMasks(9)
			rng := rand.New(rand.NewPCG(6, 6))
			x, y := randomBatch(rng, batch, 784, 10)
			loss, err := m.ForwardBackward(x, y, batch)
			if err != nil {
				t.Fatal(err)
			}
			var grads [][]float32
			for _, g := range m.Grads() {
				grads = append(grads, slices.Clone(g))
			}
			// The same inputs and masks, through gorgonia's machine.
			vm := G.NewTapeMachine(m.g)
			defer vm.Close()
			if err := vm.RunAll(); err != nil {
				t.Fatal(err)
			}
			if got := m.cost.Value().Data().(float32); math.Float32bits(got) != math.Float32bits(loss) {
				t.Fatalf("loss %v on the tape, %v on the TapeMachine", loss, got)
			}
			for i, n := range m.gradNodes {
				want := n.Value().Data().([]float32)
				for j, v := range grads[i] {
					if math.Float32bits(v) != math.Float32bits(want[j]) {
						t.Fatalf("%s gradient [%d] = %v on the tape, %v on the TapeMachine", m.names[i], j, v, want[j])
					}
				}
			}
		})
	}
}
