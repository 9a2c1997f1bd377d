package ring_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/ringtrain/ringtrain/ring"
)

// Four ranks in one process average their buffers over an in-memory ring:
// every rank ends with the same mean.
func ExampleRing_AllreduceMean() {
	const n = 4
	links := ring.MemRing(n)
	bufs := make([][]float32, n)
	var wg sync.WaitGroup
	for rank := range n {
		bufs[rank] = []float32{float32(rank), 10 * float32(rank)}
		wg.Go(func() {
			r, err := ring.New(links[rank], ring.Config{Rank: rank, Size: n, Generation: 1})
			if err != nil {
				panic(err)
			}
			defer r.Close()
			if err := r.AllreduceMean(context.Background(), bufs[rank]); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(bufs[0], bufs[3])
	// Output: [1.5 15] [1.5 15]
}
