package p2p

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/p2p/host/peerstore/pstoremem"
	ma "github.com/multiformats/go-multiaddr"
)

// testPeerIDs are n peer IDs from keys drawn from seed.
func testPeerIDs(t testing.TB, seed uint64, n int) []peer.ID {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed))
	ids := make([]peer.ID, n)
	for i := range ids {
		var key [32]byte
		for j := range key {
			key[j] = byte(rng.Uint32())
		}
		_, pub, err := crypto.GenerateEd25519Key(strings.NewReader(string(key[:])))
		if err != nil {
			t.Fatal(err)
		}
		if ids[i], err = peer.IDFromPublicKey(pub); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// TestRememberedPeersReadBack: the addresses a peerstore holds for a
// ring's members read back as bootstrap peers, each with all of its
// addresses, in order, from a file only its owner can read; no file is
// no peers; a file that is not one names the line, or says what is over
// its bound.
func TestRememberedPeersReadBack(t *testing.T) {
	ps, err := pstoremem.NewPeerstore()
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	ids := testPeerIDs(t, 7, 3)
	for i, id := range ids {
		ps.AddAddrs(id, []ma.Multiaddr{ma.StringCast(fmt.Sprintf("/ip4/10.0.0.%d/tcp/4001", i+1)), ma.StringCast(fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", 5000+i))}, peerstore.PermanentAddrTTL)
	}
	// A peer behind NAT is reached through its relay: that address too.
	relayed := ma.StringCast("/ip4/10.0.0.9/tcp/4001/p2p/" + testPeerIDs(t, 9, 1)[0].String() + "/p2p-circuit")
	ps.AddAddrs(ids[0], []ma.Multiaddr{relayed}, peerstore.PermanentAddrTTL)
	dir := t.TempDir()
	path := filepath.Join(dir, "id.peers")
	if got, err := KnownPeers(path); got != nil || err != nil {
		t.Fatalf("no file: %v, %v; want none", got, err)
	}
	if err := RememberPeers(path, ps, ids); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the file: %v, %v; want mode 0600", st, err)
	}
	got, err := KnownPeers(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ids) {
		t.Fatalf("%d peers read back; want %d", len(got), len(ids))
	}
	if !slices.ContainsFunc(got[0].Addrs, relayed.Equal) {
		t.Errorf("peer 0's relayed address %s not read back: %v", relayed, got[0].Addrs)
	}
	for i, ai := range got {
		want := 2
		if i == 0 {
			want = 3 // and the relayed one
		}
		if ai.ID != ids[i] || len(ai.Addrs) != want || !slices.ContainsFunc(ai.Addrs, func(a ma.Multiaddr) bool { return a.String() == fmt.Sprintf("/ip4/10.0.0.%d/tcp/4001", i+1) }) {
			t.Errorf("peer %d: %v; want %s at its %d addresses", i, ai, ids[i], want)
		}
	}
	many := testPeerIDs(t, 8, maxKnownPeers+1)
	var tooMany strings.Builder
	for _, id := range many {
		fmt.Fprintf(&tooMany, "/ip4/10.0.0.1/tcp/4001/p2p/%s\n", id)
	}
	good := fmt.Sprintf("/ip4/10.0.0.1/tcp/4001/p2p/%s\n", ids[0])
	for _, tc := range []struct{ name, text, want string }{
		{"not a multiaddr", good + "hello\n", "line 2"},
		{"no peer ID", "/ip4/10.0.0.1/tcp/4001\n", "line 1"},
		{"no address", good + "/p2p/" + ids[1].String() + "\n", "line 2"},
		{"too many peers", tooMany.String(), "over 256 peers"},
		{"too big", good + strings.Repeat("#", maxPeersFile) + "\n", "line 2"},
	} {
		bad := filepath.Join(dir, "bad.peers")
		if err := os.WriteFile(bad, []byte(tc.text), 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := KnownPeers(bad)
		if !errors.Is(err, ErrPeersFile) || !strings.Contains(err.Error(), tc.want) || got != nil {
			t.Errorf("%s: %v, %v; want ErrPeersFile saying %q", tc.name, got, err, tc.want)
		}
	}
}

// FuzzKnownPeers: any file reads as peers, each with an ID and an
// address, or is refused with ErrPeersFile, without panic.
func FuzzKnownPeers(f *testing.F) {
	ids := testPeerIDs(f, 9, 1)
	f.Add([]byte(fmt.Sprintf("/ip4/10.0.0.1/tcp/4001/p2p/%s\n\n/ip6/::1/tcp/1/p2p/%s\n", ids[0], ids[0])))
	f.Add([]byte("garbage\x00\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(t.TempDir(), "id.peers")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		got, err := KnownPeers(path)
		if err != nil {
			if !errors.Is(err, ErrPeersFile) {
				t.Fatalf("%v: not ErrPeersFile", err)
			}
			return
		}
		for _, ai := range got {
			if ai.ID == "" || len(ai.Addrs) == 0 {
				t.Fatalf("a peer without an ID or an address: %v", ai)
			}
		}
	})
}
