package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/pbnjay/memory"

	"github.com/ringtrain/ringtrain/data"
	"github.com/ringtrain/ringtrain/train"
)

// fitsMemory refuses a model that would not fit in this machine's memory
// (a crafted checkpoint's input of 16384×16384 was killed at 24 GB).
func fitsMemory(spec train.ModelConfig) error {
	need, err := spec.MemoryBytes()
	if err != nil {
		return err
	}
	if mem := memory.TotalMemory(); mem > 0 && uint64(need) > mem/2 {
		return fmt.Errorf("a model of input %v needs about %d MiB, more than half this machine's %d MiB of memory: %w",
			spec.Spec.Input, need>>20, mem>>20, train.ErrSpec)
	}
	return nil
}

// runPredict is `ringtrain predict --checkpoint FILE --image FILE`: the
// class and the top probabilities for one PNG or JPEG of any size, colour
// or grayscale.
func runPredict(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("predict", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ckpt := fs.String("checkpoint", "", "checkpoint written by join")
	imgPath := fs.String("image", "", "PNG or JPEG image")
	top := fs.Int("top", 3, "how many classes to list")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("predict: %w: %w", errUsage, err)
	}
	if *ckpt == "" || *imgPath == "" {
		return fmt.Errorf("predict: --checkpoint and --image are required: %w", errUsage)
	}
	c, err := train.LoadCheckpoint(*ckpt)
	if err != nil {
		return err
	}
	if err := c.Whole(); err != nil {
		return fmt.Errorf("predict: %s: %w", *ckpt, err)
	}
	if l := c.Model.Spec.Loss; l != train.CrossEntropy {
		return fmt.Errorf("predict: %s is a model of float targets (loss %s), which reads a table's rows, not an image; ringtrain export writes it for other runtimes: %w", *ckpt, l, errUsage)
	}
	spec := c.Model
	spec.Batch = 1
	if err := fitsMemory(spec); err != nil {
		return fmt.Errorf("predict: %s: %w", *ckpt, err)
	}
	im, err := data.ReadImageFile(*imgPath)
	if err != nil {
		return fmt.Errorf("predict: %w", err)
	}
	x, err := prepare(c, im)
	if err != nil {
		return fmt.Errorf("predict: %s: %w", *imgPath, err)
	}
	model, err := train.NewModel(spec)
	if err != nil {
		return err
	}
	defer model.Close()
	if err := c.LoadInto(model); err != nil {
		return err
	}
	// Forward only, in evaluation mode; the label is a placeholder (it
	// feeds the loss, which is not shown).
	if _, err := model.Forward(x, []int{0}, 1); err != nil {
		return err
	}
	shapes, err := spec.Spec.Shapes()
	if err != nil {
		return err
	}
	probs := softmax(model.Logits()[:shapes[len(shapes)-1][0]])
	order := make([]int, len(probs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case probs[a] > probs[b]:
			return -1
		case probs[a] < probs[b]:
			return 1
		}
		return 0
	})
	name := func(k int) string {
		if k < len(c.Classes) {
			return c.Classes[k]
		}
		return fmt.Sprint(k)
	}
	fmt.Fprintf(stdout, "%s: %s\n", *imgPath, name(order[0]))
	for _, k := range order[:min(*top, len(order))] {
		fmt.Fprintf(stdout, "  %-14s %.4f\n", name(k), probs[k])
	}
	return nil
}

// prepare runs the job's transforms on im, first bringing it to the
// channels and size the model was trained on when the job's transforms
// would not: any size, colour or grayscale.
func prepare(c *train.Checkpoint, im data.Image) ([]float32, error) {
	want := c.Input
	specs := c.Transforms
	p, err := data.NewPipeline(specs)
	if err != nil {
		return nil, err
	}
	if ch, h, w, err := p.OutShape(im.H, im.W, im.C); err != nil || [3]int{ch, h, w} != want {
		var pre []data.TransformSpec
		if im.C != want[0] {
			pre = append(pre, data.TransformSpec{Name: "Grayscale", Args: []json.RawMessage{json.RawMessage(fmt.Sprint(want[0]))}})
		}
		size, _ := json.Marshal([]int{want[1], want[2]})
		pre = append(pre, data.TransformSpec{Name: "Resize", Args: []json.RawMessage{size}})
		if p, err = data.NewPipeline(append(pre, specs...)); err != nil {
			return nil, err
		}
		if ch, h, w, err := p.OutShape(im.H, im.W, im.C); err != nil || [3]int{ch, h, w} != want {
			return nil, fmt.Errorf("the image (%d×%d×%d) cannot be brought to the model's %d×%d×%d: %v", im.H, im.W, im.C, want[1], want[2], want[0], err)
		}
	}
	x := make([]float32, want[0]*want[1]*want[2])
	var ws data.Workspace
	if err := p.Apply(&ws, im, x, c.Seed, 0, 0); err != nil {
		return nil, err
	}
	return x, nil
}

func softmax(logits []float32) []float64 {
	hi := math.Inf(-1)
	for _, v := range logits {
		hi = math.Max(hi, float64(v))
	}
	out := make([]float64, len(logits))
	var sum float64
	for i, v := range logits {
		out[i] = math.Exp(float64(v) - hi)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}
