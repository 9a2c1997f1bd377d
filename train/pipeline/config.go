package pipeline

import (
	"fmt"
	"slices"
	"time"

	"github.com/ringtrain/ringtrain/train"
)

// MaxStages bounds a job's stages (and so what a config can make a peer
// build or expect).
const MaxStages = 256

// Config is a job's "pipeline" section.
type Config struct {
	// Stages is S, how many stages the layer list is cut into; every
	// stage is held by world_size / S peers.
	Stages int `json:"stages"`
	// MicroBatches is M, how many micro-batches a batch is cut into.
	MicroBatches int `json:"micro_batches"`
	// Schedule is "1f1b" (the default) or "gpipe".
	Schedule Kind `json:"schedule,omitempty"`
	// Split, if given, is the first layer of stages 1 … S−1, increasing.
	// Without it the split balances the stages by measured cost.
	Split []int `json:"split,omitempty"`
	// Boundary is how activations and their gradients cross: "f32" (the
	// default, exact) or "bf16" (half the bytes, rounded).
	Boundary string `json:"boundary,omitempty"`
	// Threads is how many goroutines a stage's matrix products are split
	// over (0: GOMAXPROCS): a machine's own setting, not the job's.
	Threads int `json:"-"`
}

// Check says whether the config can run spec with batches of batch
// samples, and why not, before anything trains.
func (c Config) Check(spec train.Spec, batch int) error {
	if _, err := spec.Shapes(); err != nil {
		return fmt.Errorf("pipeline: %w", err)
	}
	return c.CheckLayers(len(spec.Layers), batch)
}

// CheckLayers is Check for a model of layers layers, whatever they are.
func (c Config) CheckLayers(layers, batch int) error {
	switch {
	case c.Stages < 1 || c.Stages > MaxStages:
		return fmt.Errorf("stages %d; want 1 to %d: %w", c.Stages, MaxStages, ErrConfig)
	case c.Stages > layers:
		return fmt.Errorf("stages %d for a model of %d layers; a stage needs at least one layer: %w", c.Stages, layers, ErrConfig)
	case c.MicroBatches < 1 || c.MicroBatches > batch:
		return fmt.Errorf("micro_batches %d for batches of %d; want 1 to the batch size: %w", c.MicroBatches, batch, ErrConfig)
	}
	if _, err := Schedule(c.kind(), c.Stages, 0, c.MicroBatches); err != nil {
		return err
	}
	if _, err := c.encoding(); err != nil {
		return err
	}
	if c.Split != nil {
		if _, err := Bounds(c.Split, c.Stages, layers); err != nil {
			return err
		}
	}
	return nil
}

func (c Config) kind() Kind {
	if c.Schedule == "" {
		return OneFOneB
	}
	return c.Schedule
}

func (c Config) encoding() (Encoding, error) {
	switch c.Boundary {
	case "", "f32":
		return F32, nil
	case "bf16":
		return BF16, nil
	}
	return 0, fmt.Errorf("boundary %q; want \"f32\" or \"bf16\": %w", c.Boundary, ErrConfig)
}

// MicroSize is how many samples each micro-batch of a full batch has (the
// last may have fewer).
func (c Config) MicroSize(batch int) int { return (batch + c.MicroBatches - 1) / c.MicroBatches }

// Bounds turns a split (the first layer of stages 1 … S−1) into each
// stage's layers [lo, hi).
func Bounds(split []int, stages, layers int) ([][2]int, error) {
	if len(split) != stages-1 {
		return nil, fmt.Errorf("split %v has %d cuts; %d stages need %d: %w", split, len(split), stages, stages-1, ErrConfig)
	}
	out := make([][2]int, 0, stages)
	lo := 0
	for _, cut := range split {
		if cut <= lo || cut >= layers {
			return nil, fmt.Errorf("split %v: cut %d leaves a stage without layers (a cut is the first layer of a stage, from 1 to %d, increasing): %w", split, cut, layers-1, ErrConfig)
		}
		out = append(out, [2]int{lo, cut})
		lo = cut
	}
	return append(out, [2]int{lo, layers}), nil
}

// Balance cuts layers of the given costs into stages contiguous parts with
// the smallest largest part, and returns the cuts (the first layer of
// stages 1 … S−1). Of splits as good, it takes the one with the earliest
// cuts, so every peer computing it from the same costs gets the same.
func Balance(costs []float64, stages int) ([]int, error) {
	n := len(costs)
	if stages < 1 || stages > n {
		return nil, fmt.Errorf("%d stages for %d layers: %w", stages, n, ErrConfig)
	}
	sum := make([]float64, n+1)
	for i, c := range costs {
		sum[i+1] = sum[i] + c
	}
	// best[k][i]: the smallest largest part cutting layers [0, i) into k
	// parts; from[k][i]: where the last of them begins.
	best := make([][]float64, stages+1)
	from := make([][]int, stages+1)
	for k := range best {
		best[k] = make([]float64, n+1)
		from[k] = make([]int, n+1)
		for i := range best[k] {
			best[k][i] = -1
		}
	}
	best[0][0] = 0
	for k := 1; k <= stages; k++ {
		for i := k; i <= n; i++ {
			for j := i - 1; j >= k-1; j-- {
				if best[k-1][j] < 0 {
					continue
				}
				v := max(best[k-1][j], sum[i]-sum[j])
				if best[k][i] < 0 || v <= best[k][i] {
					best[k][i], from[k][i] = v, j
				}
			}
		}
	}
	cuts := make([]int, stages-1)
	for k, i := stages, n; k > 1; k-- {
		i = from[k][i]
		cuts[k-2] = i
	}
	return cuts, nil
}

// MeasureCosts times each layer's forward and backward pass on a
// micro-batch of micro samples (the median of a few runs), for Balance.
func MeasureCosts(model train.ModelConfig, micro int) ([]float64, error) {
	model.Batch = micro
	if _, err := model.Shapes(); err != nil {
		return nil, fmt.Errorf("pipeline: %w", err)
	}
	costs := make([]float64, len(model.Spec.Layers))
	for i := range model.Spec.Layers {
		if err := func() error {
			st, err := train.NewStage(train.StageConfig{Model: model, Lo: i, Hi: i + 1})
			if err != nil {
				return err
			}
			defer st.Close()
			ins := make([][]float32, len(st.Inputs()))
			for k, c := range st.Inputs() {
				ins[k] = make([]float32, micro*c.Values())
				for j := range ins[k] {
					ins[k][j] = float32(j%7) * 0.1
					if i == 0 && model.Spec.Layers[0].Type == train.LayerEmbedding {
						ins[k][j] = float32(j % 7) // bytes: an embedding takes whole numbers
					}
				}
			}
			var y train.Labels
			switch {
			case st.Last() && st.Targets() > 0:
				y.Target = make([]float32, micro*st.Targets())
			case st.Last():
				y.Class = make([]int, micro*st.Positions())
			}
			var gout [][]float32
			for _, c := range st.Outputs() {
				gout = append(gout, make([]float32, micro*c.Values()))
			}
			var times []time.Duration
			for range 5 {
				t0 := time.Now()
				if _, _, err := st.Backward(0, ins, y, micro, gout); err != nil {
					return err
				}
				times = append(times, time.Since(t0))
			}
			slices.Sort(times)
			costs[i] = times[len(times)/2].Seconds()
			return nil
		}(); err != nil {
			return nil, fmt.Errorf("pipeline: measuring layer %d: %w", i, err)
		}
	}
	return costs, nil
}
