package p2p

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// TestDirectLinks: in a formed ring of four, ranks 0 and 2 each open a
// link straight to ranks 1 and 3 (no member between them forwards), and
// what each writes reaches each reader whole and apart from the others'.
func TestDirectLinks(t *testing.T) {
	const n = 4
	j := job
	j.WorldSize = n
	hs := startHosts(t, n, nil)
	nodes := startNodes(t, hs, j)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ms := make([]*Membership, n)
	rings := make([]*ring.Ring, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, h := range hs {
		links := NewRingLinks(h, nodes[i], LinksConfig{Logger: zerolog.Nop()})
		t.Cleanup(links.Close)
		ms[i] = NewMembership(nodes[i], links, 20*time.Second)
		wg.Go(func() { rings[i], _, errs[i] = ms[i].Form(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, r := range rings {
		defer r.Close()
	}
	donors, takers := []int{0, 2}, []int{1, 3}
	payload := func(from, to int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("%d→%d;", from, to)), 100_000) }
	got := make([][][]byte, n) // got[taker][k]: what donor k sent it
	for i, m := range ms {
		rank := rings[i].Rank()
		wg.Go(func() {
			if rank%2 == 0 {
				out, _, err := m.DirectLinks(ctx, takers, nil)
				if err != nil {
					errs[i] = err
					return
				}
				for k, w := range out {
					_, errs[i] = w.Write(payload(rank, takers[k]))
					w.Close()
				}
				return
			}
			_, in, err := m.DirectLinks(ctx, nil, donors)
			if err != nil {
				errs[i] = err
				return
			}
			got[rank] = make([][]byte, len(in))
			var inner sync.WaitGroup
			for k, r := range in {
				inner.Go(func() { got[rank][k], _ = io.ReadAll(r); r.Close() })
			}
			inner.Wait()
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, to := range takers {
		for k, from := range donors {
			if !bytes.Equal(got[to][k], payload(from, to)) {
				t.Errorf("rank %d from rank %d: %d bytes, not what was sent (%d)", to, from, len(got[to][k]), len(payload(from, to)))
			}
		}
	}
}
