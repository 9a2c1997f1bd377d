package train

import (
	"errors"
	"fmt"

	"github.com/ringtrain/ringtrain/data"
)

// Result is what an evaluation found.
type Result struct {
	Loss     float64   // mean cross-entropy over the samples
	Accuracy float64   // share of samples whose largest logit is their label
	PerClass []float64 // accuracy within each class (NaN where a class has no samples)
	Samples  int
}

// Evaluate runs the model over every batch of an epoch and scores it.
// It runs the model forward only, in evaluation mode.
func Evaluate(m Model, e *data.Epoch, classes int) (Result, error) {
	var r Result
	correct := make([]int, classes)
	total := make([]int, classes)
	var lossSum float64
	err := e.Each(func(b *data.Batch) error {
		loss, err := m.Forward(b.X, b.Y, b.N)
		if err != nil {
			return err
		}
		lossSum += float64(loss) * float64(b.N)
		logits := m.Logits()
		for i, y := range b.Y {
			row := logits[i*classes : (i+1)*classes]
			best := 0
			for k, v := range row {
				if v > row[best] {
					best = k
				}
			}
			if y < 0 || y >= classes {
				return fmt.Errorf("train: label %d outside [0, %d)", y, classes)
			}
			total[y]++
			if best == y {
				correct[y]++
			}
		}
		r.Samples += b.N
		return nil
	})
	if err != nil {
		return r, err
	}
	if r.Samples == 0 {
		return r, errors.New("train: nothing to evaluate")
	}
	all := 0
	r.PerClass = make([]float64, classes)
	for k := range classes {
		all += correct[k]
		r.PerClass[k] = float64(correct[k]) / float64(total[k])
	}
	r.Loss = lossSum / float64(r.Samples)
	r.Accuracy = float64(all) / float64(r.Samples)
	return r, nil
}
