package p2p

import (
	"context"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// One generation holds, between the same peers at once, the ring of all
// members, a ring per pipeline stage and the links between stages each
// way, on either data plane: each link reaches the one it was opened for.
func TestChannelsOfOneGeneration(t *testing.T) {
	for _, plane := range []DataPlane{PlaneTLS, PlaneLibp2p, PlaneTCP} {
		t.Run(fmt.Sprint(plane), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			const n = 4
			s := swarm(t, n, Job{Name: "channels", ConfigHash: job.ConfigHash, WorldSize: n})
			if err := s.Join(ctx); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			sums := make([][2]float32, n) // world, stage
			got := make([][2]string, n)   // from the stage before, from the stage after
			for i, h := range s.Hosts {
				links := NewRingLinks(h, s.Nodes[i], LinksConfig{Plane: plane, TCPListen: "127.0.0.1:0", Logger: zerolog.Nop()})
				t.Cleanup(links.Close)
				f := s.Formations[i]
				wg.Go(func() {
					err := func() error {
						stage := f.Rank / 2
						ranks := []int{2 * stage, 2*stage + 1}
						var world, st ring.Transport
						var fw, bw io.WriteCloser
						var fr, br io.ReadCloser
						var errs [4]error
						var inner sync.WaitGroup
						inner.Go(func() { world, errs[0] = links.Connect(ctx, f) })
						inner.Go(func() { st, errs[1] = links.ConnectRing(ctx, f, ChannelStage, ranks) })
						if stage == 0 {
							inner.Go(func() { fw, _, errs[2] = links.Pair(ctx, f, ChannelForward, f.Rank+2, -1) })
							inner.Go(func() { _, br, errs[3] = links.Pair(ctx, f, ChannelBackward, -1, f.Rank+2) })
						} else {
							inner.Go(func() { _, fr, errs[2] = links.Pair(ctx, f, ChannelForward, -1, f.Rank-2) })
							inner.Go(func() { bw, _, errs[3] = links.Pair(ctx, f, ChannelBackward, f.Rank-2, -1) })
						}
						inner.Wait()
						for _, err := range errs {
							if err != nil {
								return err
							}
						}
						wr, err := ring.New(world, ring.Config{Rank: f.Rank, Size: n, Generation: f.Generation})
						if err != nil {
							return err
						}
						defer wr.Close()
						sr, err := ring.New(st, ring.Config{Rank: f.Rank % 2, Size: 2, Generation: f.Generation})
						if err != nil {
							return err
						}
						defer sr.Close()
						w := []float32{float32(f.Rank + 1)}
						if err := wr.AllreduceSum(ctx, w); err != nil {
							return err
						}
						v := []float32{float32(f.Rank + 1)}
						if err := sr.AllreduceSum(ctx, v); err != nil {
							return err
						}
						sums[f.Rank] = [2]float32{w[0], v[0]}
						say := func(w io.WriteCloser) error {
							_, err := fmt.Fprintf(w, "from rank %d\n", f.Rank)
							return err
						}
						hear := func(r io.Reader) (string, error) {
							b := make([]byte, len("from rank 0\n"))
							_, err := io.ReadFull(r, b)
							return string(b), err
						}
						if stage == 0 {
							if err := say(fw); err != nil {
								return err
							}
							got[f.Rank][1], err = hear(br)
							fw.Close()
							br.Close()
						} else {
							got[f.Rank][0], err = hear(fr)
							if err == nil {
								err = say(bw)
							}
							fr.Close()
							bw.Close()
						}
						return err
					}()
					if err != nil {
						t.Errorf("rank %d: %v", f.Rank, err)
					}
				})
			}
			wg.Wait()
			for r := range n {
				stageSum := float32(2*(r/2)+1) + float32(2*(r/2)+2)
				if sums[r] != [2]float32{10, stageSum} {
					t.Errorf("rank %d: world sum %v, stage sum %v; want 10 and %v", r, sums[r][0], sums[r][1], stageSum)
				}
				want := [2]string{"", fmt.Sprintf("from rank %d\n", r+2)}
				if r >= 2 {
					want = [2]string{fmt.Sprintf("from rank %d\n", r-2), ""}
				}
				if got[r] != want {
					t.Errorf("rank %d heard %q; want %q", r, got[r], want)
				}
			}
		})
	}
}
