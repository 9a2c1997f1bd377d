package ring

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// sites is n members alternating between two sites (even members in one,
// odd in the other, as peer IDs interleave them): fast links within a
// site, slow ones between.
func sites(n int, fast, slow uint64) [][]Link {
	in := make([][]Link, n)
	for i := range in {
		in[i] = make([]Link, n)
		for j := range in[i] {
			bw := fast
			if i%2 != j%2 {
				bw = slow
			}
			in[i][j] = Link{Bandwidth: bw, RTT: 100_000}
		}
	}
	return in
}

func crossings(order []int) int {
	c := 0
	for k, m := range order {
		if m%2 != order[(k+1)%len(order)]%2 {
			c++
		}
	}
	return c
}

func isPermutation(order []int, n int) bool {
	s := slices.Sorted(slices.Values(order))
	for i, v := range s {
		if v != i {
			return false
		}
	}
	return len(s) == n
}

func TestOrderCrossesSlowLinkOnce(t *testing.T) {
	for _, n := range []int{4, 6, 8, 16, 20} {
		in := sites(n, 125_000_000, 12_500_000) // 1 Gbit/s and 100 Mbit/s
		ident := make([]int, n)
		for i := range ident {
			ident[i] = i
		}
		got := Order(in)
		if !isPermutation(got, n) || got[0] != 0 {
			t.Fatalf("n=%d: order %v is not a ring of the members from member 0", n, got)
		}
		if c := crossings(got); c != 2 {
			t.Errorf("n=%d: order %v crosses between the sites %d times, want 2 (by ID: %d)", n, got, c, crossings(ident))
		}
	}
}

// TestOrderBottleneckFirst: a ring with one slow link loses to one whose
// every link is middling, though its total time is less.
func TestOrderBottleneckFirst(t *testing.T) {
	const fast, mid, slow = 1_000_000_000, 100_000_000, 10_000_000
	in := make([][]Link, 4)
	for i := range in {
		in[i] = make([]Link, 4)
		for j := range in[i] {
			in[i][j] = Link{Bandwidth: mid, RTT: 1000}
		}
	}
	// 0→1→2→3→0 is fast but for 3→0; 0→2 and 2→... are middling.
	for _, e := range [][2]int{{0, 1}, {1, 2}, {2, 3}} {
		in[e[1]][e[0]].Bandwidth = fast
	}
	in[0][3].Bandwidth = slow
	got := Order(in)
	if OrderBottleneck(in, got) != mid {
		t.Errorf("order %v has bottleneck %d, want %d", got, OrderBottleneck(in, got), mid)
	}
	if OrderBottleneck(in, []int{0, 1, 2, 3}) != slow {
		t.Fatal("the test's matrix is not what it says")
	}
}

// TestOrderIsExact compares the solver with every permutation of small
// random matrices.
func TestOrderIsExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		n := 3 + trial%5
		in := linksOf(n, func() Link { return Link{Bandwidth: 1 + rng.Uint64N(1e9), RTT: rng.Uint64N(1e8)} })
		c := costs(in)
		got := Order(in)
		want := c.score(got)
		perm := make([]int, n)
		for i := range perm {
			perm[i] = i
		}
		var walk func(k int)
		walk = func(k int) {
			if k == n {
				if s := c.score(perm); s.better(want) {
					t.Fatalf("trial %d: %v scores %+v, better than Order's %v (%+v)", trial, perm, s, got, want)
				}
				return
			}
			for i := k; i < n; i++ {
				perm[k], perm[i] = perm[i], perm[k]
				walk(k + 1)
				perm[k], perm[i] = perm[i], perm[k]
			}
		}
		walk(1)
	}
}

// TestOrderStable: with measures alike (within the grid's step), the
// members keep their given order, and the same measures give the same
// order however often solved.
func TestOrderStable(t *testing.T) {
	in := sites(6, 1_000_000_000, 1_000_000_000)
	in[3][2].Bandwidth = 1_050_000_000 // noise
	if got := Order(in); !slices.Equal(got, []int{0, 1, 2, 3, 4, 5}) {
		t.Errorf("alike links: order %v, want the given order", got)
	}
	in = sites(9, 125_000_000, 12_500_000)
	first := Order(in)
	for range 5 {
		if got := Order(in); !slices.Equal(got, first) {
			t.Fatalf("the same measures gave %v, then %v", first, got)
		}
	}
}

// TestOrderOfLies: whatever a member says of its links — nothing, zeros,
// the largest numbers there are, a row of the wrong length — the solver
// gives a ring of every member and does not fail.
func TestOrderOfLies(t *testing.T) {
	max := ^uint64(0)
	cases := map[string]func(in [][]Link){
		"zeros": func(in [][]Link) { clear(in[2]) },
		"largest": func(in [][]Link) {
			for j := range in[2] {
				in[2][j] = Link{Bandwidth: max, RTT: max}
			}
		},
		"all zero": func(in [][]Link) {
			for i := range in {
				clear(in[i])
			}
		},
		"one": func(in [][]Link) {
			for j := range in[2] {
				in[2][j] = Link{Bandwidth: 1, RTT: 1}
			}
		},
		"short row":  func(in [][]Link) { in[2] = in[2][:3] },
		"slow twice": func(in [][]Link) { in[1][0].Bandwidth, in[0][5].Bandwidth = 1, 1 },
	}
	for name, lie := range cases {
		in := sites(6, 125_000_000, 12_500_000)
		lie(in)
		got := Order(in)
		if !isPermutation(got, 6) || got[0] != 0 {
			t.Errorf("%s: order %v is not a ring of the 6 members from member 0", name, got)
		}
	}
}

func TestGridLevel(t *testing.T) {
	prev := -1
	for _, x := range []uint64{0, 4, 5, 6, 1000, 1 << 40, ^uint64(0)} {
		l, v := gridLevel(x)
		if l < prev || (x >= 5 && v > x) {
			t.Errorf("gridLevel(%d) = %d, %d", x, l, v)
		}
		prev = l
	}
	// 10% apart is at most one step: noise of that size moves a link by
	// one level at most.
	a, _ := gridLevel(1_000_000_000)
	b, _ := gridLevel(1_100_000_000)
	if b-a > 1 {
		t.Errorf("1.0e9 and 1.1e9 are %d steps apart", b-a)
	}
}

func BenchmarkOrder16(b *testing.B) {
	in := sites(16, 125_000_000, 12_500_000)
	for b.Loop() {
		Order(in)
	}
}

// TestLeastTimeTies: the table over the sets of members other than 0
// gives the order the plain Held–Karp table gives — the same ring where
// times tie, which every member must pick alike — on small matrices whose
// few distinct measures make ties common, at every level.
func TestLeastTimeTies(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 300 {
		n := 3 + trial%8
		in := linksOf(n, func() Link { return Link{Bandwidth: 1e8 * (1 + rng.Uint64N(3)), RTT: 1e6 * rng.Uint64N(3)} })
		c := costs(in)
		for _, level := range slices.Compact(slices.Sorted(slices.Values(c.level))) {
			if !c.ringAt(level) {
				continue
			}
			if got, want := c.leastTime(level), leastTimeRef(c, level); !slices.Equal(got, want) {
				t.Fatalf("trial %d, level %d: %v, the plain table %v", trial, level, got, want)
			}
		}
	}
}

// leastTimeRef is Held–Karp over every set of members, lower members
// first where times tie.
func leastTimeRef(c *linkCosts, level int) []int {
	n := c.n
	const none = ^uint64(0)
	full := 1<<n - 1
	dp := make([]uint64, (1<<n)*n)
	from := make([]int8, (1<<n)*n)
	for i := range dp {
		dp[i] = none
	}
	dp[1*n+0] = 0
	for mask := 1; mask <= full; mask += 2 {
		for j := range n {
			d := dp[mask*n+j]
			if d == none {
				continue
			}
			for k := range n {
				if mask&(1<<k) != 0 || c.level[j*n+k] < level {
					continue
				}
				at := (mask|1<<k)*n + k
				if t := d + c.time[j*n+k]; t < dp[at] {
					dp[at], from[at] = t, int8(j)
				}
			}
		}
	}
	last, best := -1, none
	for j := 1; j < n; j++ {
		d := dp[full*n+j]
		if d == none || c.level[j*n] < level {
			continue
		}
		if t := d + c.time[j*n]; t < best {
			last, best = j, t
		}
	}
	order := make([]int, n)
	for k, mask := n-1, full; k > 0; k-- {
		order[k] = last
		prev := int(from[mask*n+last])
		mask &^= 1 << last
		last = prev
	}
	return order
}

// linksOf is an n × n matrix of measures, each from link.
func linksOf(n int, link func() Link) [][]Link {
	in := make([][]Link, n)
	for i := range in {
		in[i] = make([]Link, n)
		for j := range in[i] {
			in[i][j] = link()
		}
	}
	return in
}
