// Command gpteval scores a language model's checkpoint on the windows
// ../shared/bench/torch_gpt.py validates on: 64 windows of context+1
// bytes at offsets evenly spaced through the corpus's validation part, the
// mean cross-entropy over every position, in nats and bits per byte — so
// that ringtrain's validation loss and the reference's are the same
// measure.
//
// Usage: go run ./internal/gpteval CHECKPOINT TEXT_FOLDER
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gpteval:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 2 {
		return fmt.Errorf("usage: gpteval CHECKPOINT TEXT_FOLDER")
	}
	c, err := train.LoadCheckpoint(args[0])
	if err != nil {
		return err
	}
	corpus, _, err := (&data.TextSpec{Folder: args[1]}).Read(data.MaxTextBytes)
	if err != nil {
		return err
	}
	_, val := data.SplitText(corpus)
	T := c.Model.Spec.Input[0]
	const n = 64
	cfg := c.Model
	cfg.Batch = n
	m, err := train.NewModel(cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := c.LoadInto(m); err != nil {
		return err
	}
	x, y := make([]float32, n*T), make([]int, n*T)
	for k := range n {
		// torch.linspace(0, len(val) − T − 2, 64).long(): float32 steps, truncated.
		o := int(float32(k) * float32(len(val)-T-2) / float32(n-1))
		for i := range T {
			x[k*T+i], y[k*T+i] = float32(val[o+i]), int(val[o+i+1])
		}
	}
	loss, err := m.Forward(x, y, n)
	if err != nil {
		return err
	}
	fmt.Printf("{\"windows\": %d, \"val_loss\": %.4f, \"val_bpb\": %.4f}\n", n, loss, float64(loss)/math.Ln2)
	return nil
}
