package p2p

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/rs/zerolog"

	"github.com/ringtrain/ringtrain/ring"
)

// twoSites gives a member the links of two sites that peer IDs
// interleave: the members at even places by ID in one, odd in the other,
// 1 Gbit/s within a site and 100 Mbit/s between.
func twoSites(f *Formation, row []ring.Link) {
	for j := range row {
		row[j] = ring.Link{Bandwidth: 125_000_000, RTT: 100_000}
		if j%2 != f.Rank%2 {
			row[j].Bandwidth = 12_500_000
		}
	}
}

// TestMembershipOrdersByLinks: six peers measure their links, share the
// rows and rank themselves by the order solved from them — all alike, and
// crossing between the sites twice where by ID they cross six times. A
// member that lies about its links changes the order at most: every
// member still gets the same ranks, and the ring works.
func TestMembershipOrdersByLinks(t *testing.T) {
	slow(t)
	cases := []struct {
		name      string
		liar      func(f *Formation, row []ring.Link)
		crossings int  // -1: any
		badProbes bool // the liar's probes are out of bounds too
		garble    garble
		// equivocate: the liar signs another row for the rows' second
		// ring, every link the fastest.
		equivocate bool
	}{
		{"honest", nil, 2, false, 0, false},
		{"liar sends malformed probes", twoSites, -1, true, 0, false},
		{"liar says every link is the fastest", fastest, -1, false, 0, false},
		{"liar says nothing", func(f *Formation, row []ring.Link) { clear(row) }, -1, false, 0, false},
		{"liar says its site's links are slowest", func(f *Formation, row []ring.Link) {
			for j := range row {
				row[j] = ring.Link{Bandwidth: 1, RTT: ^uint64(0) / 4}
			}
		}, -1, false, 0, false},
		// Every honest row comes whole the other way round: the members
		// order by the true links, as if the liar had been honest.
		{"liar alters what it forwards", twoSites, 2, false, garbleAll, false},
		// The liar alters only the last row it forwards, which only the
		// member after it receives, and writes a 4-byte payload — a count
		// the members could sum of those who found a bad row — as zero,
		// so the member after that hears that none did.
		{"liar alters one row and zeroes counts", twoSites, 2, false, garbleLastZeroCounts, false},
		{"liar signs two rows", twoSites, -1, false, 0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			const n = 6
			j := job
			j.WorldSize = n
			hs := startHosts(t, n, nil)
			nodes := startNodes(t, hs, j)
			ids := make([]peer.ID, n)
			for i, h := range hs {
				ids[i] = h.ID()
			}
			slices.Sort(ids)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rings := make([]*ring.Ring, n)
			ms := make([]*Membership, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, h := range hs {
				links := NewRingLinks(h, nodes[i], LinksConfig{Logger: zerolog.Nop()})
				t.Cleanup(links.Close)
				ms[i] = NewMembership(nodes[i], links, 20*time.Second)
				ms[i].shapeRow = twoSites
				if tc.liar != nil && h.ID() == ids[2] {
					ms[i].shapeRow = tc.liar
					ms[i].badProbes = tc.badProbes
					if tc.garble != 0 {
						ms[i].garbleRows = func(t ring.Transport) ring.Transport { return &garbling{Transport: t, how: tc.garble, n: n} }
					}
					if tc.equivocate {
						ms[i].otherRow = fastest
					}
				}
				wg.Go(func() { rings[i], _, errs[i] = ms[i].Form(ctx) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			order := ms[0].Members()
			for i := range ms {
				if got := ms[i].Members(); !slices.Equal(got, order) {
					t.Fatalf("peer %d ranks the members %v, peer 0 %v", i, got, order)
				}
			}
			cross := 0
			for k, s := range order {
				a, b := slices.Index(ids, peer.ID(mustDecode(t, s))), slices.Index(ids, peer.ID(mustDecode(t, order[(k+1)%n])))
				if a%2 != b%2 {
					cross++
				}
			}
			if tc.crossings >= 0 && cross != tc.crossings {
				t.Errorf("the ring %v crosses between the sites %d times, want %d", order, cross, tc.crossings)
			}
			bufs := make([][]float32, n)
			for i, r := range rings {
				bufs[i] = []float32{float32(r.Rank() + 1)}
				wg.Go(func() { errs[i] = r.AllreduceSum(ctx, bufs[i]) })
			}
			wg.Wait()
			for i, r := range rings {
				if errs[i] != nil || bufs[i][0] != n*(n+1)/2 {
					t.Errorf("peer %d: allreduce %v, %v", i, bufs[i], errs[i])
				}
				r.Close()
			}
		})
	}
}

// fastest says every link is the fastest there is.
func fastest(f *Formation, row []ring.Link) {
	for j := range row {
		row[j] = ring.Link{Bandwidth: ^uint64(0), RTT: 1}
	}
}

// garble is how a liar alters what it forwards on the rows' rings.
type garble int

const (
	// garbleAll flips the bits of every row it forwards: the member
	// after it in a rows' ring finds all of them broken, the member
	// before it none.
	garbleAll garble = iota + 1
	// garbleLastZeroCounts flips the bits of the last row it forwards
	// and writes a 4-byte payload as zeros.
	garbleLastZeroCounts
)

// garbling alters payloads it writes on a ring of n, as how says; the
// first, its own row, and the frames' headers pass.
type garbling struct {
	ring.Transport
	how  garble
	n    int
	sent int // payloads written
}

func (g *garbling) Write(p []byte) (int, error) {
	if len(p) == ring.HeaderSize {
		return g.Transport.Write(p)
	}
	g.sent++
	q := slices.Clone(p)
	switch {
	case len(q) == 4 && g.how == garbleLastZeroCounts:
		clear(q)
	case g.sent == 1:
	case g.how == garbleAll, g.sent == g.n-1:
		for i := range q {
			q[i] ^= 0x5a
		}
	}
	return g.Transport.Write(q)
}

func mustDecode(t *testing.T, s string) peer.ID {
	t.Helper()
	id, err := peer.Decode(s)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// signedRow is a row as shareRows broadcasts it, signed with priv.
func signedRow(t *testing.T, key []byte, f *Formation, signer int, priv crypto.PrivKey, row []ring.Link) []byte {
	t.Helper()
	enc := encodeRow(row)
	sig, err := priv.Sign(rowDigest(key, f, signer, enc))
	if err != nil {
		t.Fatal(err)
	}
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(sig)))
	b = append(append(b, enc...), sig...)
	return append(b, make([]byte, 16)...) // the buffer's padding
}

// TestCheckRow: a row arrives only as its signer signed it, for this job,
// generation, ring and place.
func TestCheckRow(t *testing.T) {
	priv, pub, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	other, _, _ := crypto.GenerateEd25519Key(nil)
	id, _ := peer.IDFromPublicKey(pub)
	f := &Formation{Members: []peer.ID{"a", id, "c"}, Generation: 7}
	key := []byte("job key")
	row := []ring.Link{{Bandwidth: 5, RTT: 6}, {}, {Bandwidth: 7, RTT: 8}}
	good := signedRow(t, key, f, 1, priv, row)
	cases := []struct {
		name string
		b    func() []byte
		key  []byte
		f    *Formation
		root int
		ok   bool
	}{
		{"as signed", func() []byte { return good }, key, f, 1, true},
		{"a measure altered", func() []byte { b := slices.Clone(good); b[4] ^= 1; return b }, key, f, 1, false},
		{"the signature altered", func() []byte { b := slices.Clone(good); b[4+rowSize(3)] ^= 1; return b }, key, f, 1, false},
		{"signed by another", func() []byte { return signedRow(t, key, f, 1, other, row) }, key, f, 1, false},
		{"another job", func() []byte { return good }, []byte("other job"), f, 1, false},
		{"another generation", func() []byte { return good }, key, &Formation{Members: f.Members, Generation: 8}, 1, false},
		{"another place", func() []byte { return good }, key, f, 0, false},
		{"a signature longer than the buffer", func() []byte { b := slices.Clone(good); binary.LittleEndian.PutUint32(b, 1<<30); return b }, key, f, 1, false},
		{"short", func() []byte { return good[:10] }, key, f, 1, false},
	}
	for _, tc := range cases {
		got, err := checkRow(tc.key, tc.f, tc.root, pub, tc.b())
		if tc.ok != (err == nil) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if err != nil && !errors.Is(err, errBadRow) {
			t.Errorf("%s: %v is not errBadRow", tc.name, err)
		}
		if tc.ok && !slices.Equal(got, row) {
			t.Errorf("%s: row %v, want %v", tc.name, got, row)
		}
	}
}

func FuzzCheckRow(f *testing.F) {
	priv, pub, _ := crypto.GenerateEd25519Key(nil)
	fm := &Formation{Members: []peer.ID{"a", "b", "c"}, Generation: 1}
	enc := encodeRow(make([]ring.Link, 3))
	sig, _ := priv.Sign(rowDigest(nil, fm, 0, enc))
	f.Add(append(append(binary.LittleEndian.AppendUint32(nil, uint32(len(sig))), enc...), sig...))
	f.Fuzz(func(t *testing.T, b []byte) {
		row, err := checkRow(nil, fm, 0, pub, b)
		if err == nil && len(row) != 3 {
			t.Fatalf("row of %d", len(row))
		}
	})
}

// TestTimeProbe: a probe is read only within its bounds.
func TestTimeProbe(t *testing.T) {
	header := func(size, reserved uint32) []byte {
		return binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, size), reserved)
	}
	cases := []struct {
		name string
		b    []byte
		ok   bool
		zero bool
	}{
		{"whole", append(header(1000, 0), make([]byte, 1000)...), true, false},
		{"skipped", header(0, 0), true, true},
		{"too large", append(header(probeBytes+1, 0), make([]byte, 10)...), false, true},
		{"reserved set", append(header(10, 1), make([]byte, 10)...), false, true},
		{"cut", append(header(1000, 0), make([]byte, 999)...), false, true},
		{"no header", []byte{1, 2}, false, true},
	}
	for _, tc := range cases {
		bw, err := timeProbe(context.Background(), bytes.NewReader(tc.b))
		if tc.ok != (err == nil) || tc.zero != (bw == 0) {
			t.Errorf("%s: %d, %v", tc.name, bw, err)
		}
		if bad := tc.name == "too large" || tc.name == "reserved set"; bad != errors.Is(err, errBadProbe) {
			t.Errorf("%s: %v; errBadProbe %v", tc.name, err, bad)
		}
	}
}

func TestParseRingOrder(t *testing.T) {
	for s, want := range map[string]RingOrder{"": OrderMeasured, "measured": OrderMeasured, "id": OrderID} {
		if got, err := ParseRingOrder(s); err != nil || got != want {
			t.Errorf("%q: %v, %v", s, got, err)
		}
	}
	if _, err := ParseRingOrder("fastest"); err == nil {
		t.Error("fastest is not an order")
	}
}

func FuzzTimeProbe(f *testing.F) {
	f.Add(append(binary.LittleEndian.AppendUint32(make([]byte, 0, 8), 3), 0, 0, 0, 0, 1, 2, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		if bw, err := timeProbe(context.Background(), bytes.NewReader(b)); err != nil && bw != 0 {
			t.Fatalf("a failed probe measured %d", bw)
		}
	})
}

// BenchmarkProbe is what ordering by measured links adds to a formation:
// n peers on loopback, already formed, measure their links, share the
// rows and solve the order (Membership.Ordered), all at once.
func BenchmarkProbe(b *testing.B) {
	for _, n := range []int{4, 16} {
		b.Run(fmt.Sprintf("peers=%d", n), func(b *testing.B) {
			j := job
			j.WorldSize = n
			hs := make([]*Host, n)
			for i := range n {
				cfg := HostConfig{Listen: loopback}
				if i > 0 {
					cfg.Bootstrap = []peer.AddrInfo{info(hs[0])}
				}
				h, err := NewHost(context.Background(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				hs[i] = h
				defer h.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			ms := make([]*Membership, n)
			fs := make([]*Formation, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, h := range hs {
				node, err := NewNode(h, j, NodeConfig{})
				if err != nil {
					b.Fatal(err)
				}
				defer node.Close()
				links := NewRingLinks(h, node, LinksConfig{Logger: zerolog.Nop()})
				defer links.Close()
				ms[i] = NewMembership(node, links, time.Minute)
				wg.Go(func() { fs[i], errs[i] = node.Join(ctx) })
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				for i := range ms {
					wg.Go(func() { _, errs[i] = ms[i].Ordered(ctx, fs[i]) })
				}
				wg.Wait()
				if err := errors.Join(errs...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
