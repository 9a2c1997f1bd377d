package train_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/ringtrain/ringtrain/ring"
	"github.com/ringtrain/ringtrain/train"
)

// Two replicas of an MLP, each on its own batch, step on a ring: the ring
// averages their gradients, so both apply the same update and hold the
// same parameters after every step, which ParamHash shows.
func ExampleReplica_Step() {
	const world = 2
	links := ring.MemRing(world)
	spec := train.ModelConfig{Spec: train.MLPSpec(8, []int{16}, 3), Batch: 4, Seed: 1}
	hashes := make([][32]byte, world)
	var wg sync.WaitGroup
	for rank := range world {
		wg.Go(func() {
			model, err := train.NewModel(spec) // the same seed: the same first parameters
			if err != nil {
				panic(err)
			}
			defer model.Close()
			r, err := ring.New(links[rank], ring.Config{Rank: rank, Size: world, Generation: 1})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			rep := train.NewReplica(model, &train.SGD{LR: 0.1, Momentum: 0.9}, r)
			rng := rand.New(rand.NewPCG(uint64(rank), 7)) // each rank its own data
			for range 5 {
				x, y := make([]float32, 4*8), make([]int, 4)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				for i := range y {
					y[i] = rng.IntN(3)
				}
				if _, err := rep.Step(context.Background(), x, y, 4); err != nil {
					panic(err)
				}
			}
			hashes[rank] = rep.ParamHash()
		})
	}
	wg.Wait()
	fmt.Println("the same parameters on both:", hashes[0] == hashes[1])
	// Output: the same parameters on both: true
}
