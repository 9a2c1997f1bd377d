package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/ringtrain/ringtrain/train"
)

// runGenerate is `ringtrain generate --checkpoint FILE --prompt TEXT`: text
// from a language model's checkpoint, each byte written to stdout as it is
// sampled — from the logits at the last position of the window of the
// context's last bytes, divided by --temperature, among the --top-k most
// likely, with the generator seeded by --seed.
func runGenerate(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ckpt := fs.String("checkpoint", "", "checkpoint of a language model, written by join")
	prompt := fs.String("prompt", "\n", "the text to go on from (at most the model's context)")
	tokens := fs.Int("tokens", 200, "bytes to generate")
	temperature := fs.Float64("temperature", 0.8, "the logits' divisor: below 1 surer, above 1 more varied (0: always the likeliest)")
	topK := fs.Int("top-k", 40, "sample among this many of the likeliest bytes (0: all 256)")
	seed := fs.Uint64("seed", 1, "the sampling's seed: the same seed, checkpoint and prompt give the same text")
	if err := parseFlags(fs, args); err != nil {
		return fmt.Errorf("generate: %w: %w", errUsage, err)
	}
	switch {
	case *ckpt == "":
		return fmt.Errorf("generate: --checkpoint is required: %w", errUsage)
	case *tokens < 0 || *topK < 0 || !(*temperature >= 0) || math.IsInf(*temperature, 0):
		return fmt.Errorf("generate: --tokens %d, --top-k %d, --temperature %v; want none below 0: %w", *tokens, *topK, *temperature, errUsage)
	case *prompt == "":
		return fmt.Errorf("generate: an empty --prompt; give at least one byte to go on from: %w", errUsage)
	}
	g, err := newGenerator(*ckpt)
	if err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	defer g.model.Close()
	if len(*prompt) > g.context {
		return fmt.Errorf("generate: a prompt of %d bytes; the model's context is %d: %w", len(*prompt), g.context, errUsage)
	}
	out := bufio.NewWriter(stdout)
	defer out.Flush()
	out.WriteString(*prompt)
	text := []byte(*prompt)
	rng := rand.New(rand.NewPCG(*seed, 0x67656e))
	for range *tokens {
		if err := ctx.Err(); err != nil {
			return err
		}
		logits, err := g.next(text)
		if err != nil {
			return fmt.Errorf("generate: %w", err)
		}
		b := sample(logits, *temperature, *topK, rng)
		text = append(text, b)
		out.WriteByte(b)
		out.Flush() // streamed, a byte at a time
	}
	return out.WriteByte('\n')
}

// generator is a language model of one sample, loaded from a checkpoint.
type generator struct {
	model   train.Model
	context int
	x       []float32
	y       []int
}

func newGenerator(path string) (*generator, error) {
	c, err := train.LoadCheckpoint(path)
	if err != nil {
		return nil, err
	}
	if err := c.Whole(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	spec := c.Model
	if len(spec.Spec.Layers) == 0 || spec.Spec.Layers[0].Type != train.LayerEmbedding || len(spec.Spec.Input) != 1 {
		return nil, fmt.Errorf("%s holds a model of input %v, not a language model (its first layer an embedding of bytes): %w", path, spec.Spec.Input, train.ErrCheckpoint)
	}
	spec.Batch = 1
	if err := fitsMemory(spec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	m, err := train.NewModel(spec)
	if err != nil {
		return nil, err
	}
	if err := c.LoadInto(m); err != nil {
		m.Close()
		return nil, err
	}
	T := spec.Spec.Input[0]
	return &generator{model: m, context: T, x: make([]float32, T), y: make([]int, T)}, nil
}

// next is the logits for the byte after text: the model reads text's last
// context bytes from position 0 (zeros after them, which causal attention
// keeps from the positions before), and the last one's row is the next
// byte's.
func (g *generator) next(text []byte) ([]float32, error) {
	window := text[max(0, len(text)-g.context):]
	clear(g.x)
	for i, b := range window {
		g.x[i] = float32(b)
	}
	if _, err := g.model.Forward(g.x, g.y, 1); err != nil {
		return nil, err
	}
	logits := g.model.Logits()
	v := len(logits) / g.context
	return slices.Clone(logits[(len(window)-1)*v : len(window)*v]), nil
}

// sample draws a byte from logits: the likeliest at temperature 0, else
// from the softmax of logits/temperature over the topK likeliest (all,
// for 0).
func sample(logits []float32, temperature float64, topK int, rng *rand.Rand) byte {
	order := make([]int, len(logits))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		switch {
		case logits[a] > logits[b]:
			return -1
		case logits[a] < logits[b]:
			return 1
		}
		return 0
	})
	if temperature == 0 {
		return byte(order[0])
	}
	if topK > 0 && topK < len(order) {
		order = order[:topK]
	}
	top := float64(logits[order[0]])
	weights := make([]float64, len(order))
	var sum float64
	for i, k := range order {
		weights[i] = math.Exp((float64(logits[k]) - top) / temperature)
		sum += weights[i]
	}
	r := rng.Float64() * sum
	for i, w := range weights {
		if r -= w; r < 0 {
			return byte(order[i])
		}
	}
	return byte(order[len(order)-1])
}
