package p2p_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ringtrain/ringtrain/p2p"
)

// Two hosts on loopback, the second bootstrapped from the first, agree on
// a ring of the job: each learns its rank and the same members, in rank
// order.
func ExampleNode_Join() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	job := p2p.Job{Name: "example", ConfigHash: strings.Repeat("ab", 32), WorldSize: 2}
	var hosts []*p2p.Host
	for i := range 2 {
		cfg := p2p.HostConfig{Listen: []string{"/ip4/127.0.0.1/tcp/0"}}
		if i > 0 {
			cfg.Bootstrap = []peer.AddrInfo{{ID: hosts[0].ID(), Addrs: hosts[0].Addrs()}}
		}
		h, err := p2p.NewHost(ctx, cfg)
		if err != nil {
			panic(err)
		}
		defer h.Close()
		hosts = append(hosts, h)
	}
	rings := make([]*p2p.Formation, 2)
	var wg sync.WaitGroup
	for i, h := range hosts {
		node, err := p2p.NewNode(h, job, p2p.NodeConfig{})
		if err != nil {
			panic(err)
		}
		defer node.Close()
		wg.Go(func() {
			if rings[i], err = node.Join(ctx); err != nil {
				panic(err)
			}
		})
	}
	wg.Wait()
	fmt.Println(len(rings[0].Members), rings[0].Rank+rings[1].Rank, rings[0].Members[0] == rings[1].Members[0], rings[0].Generation)
	// Output: 2 1 true 1
}
