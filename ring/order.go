package ring

import (
	"math/bits"
	"slices"
)

// Link is what a member measured of the link to it from another member:
// bytes a second and round-trip time in nanoseconds, 0 where it has no
// measure (a median of the others' measures stands in).
type Link struct {
	Bandwidth uint64
	RTT       uint64
}

// exactOrder is the largest ring Order solves exactly: its table holds
// n·2ⁿ entries (16 MiB at 16 members), and takes tens of milliseconds.
const exactOrder = 16

// Order solves the ring order from the links' measures: in[i][j] is the
// link from member j to member i, as member i measured it (in[i][i] is not
// read). It returns the members in ring order, beginning with member 0;
// rank r sends to rank r+1 in that order.
//
// Its goal is a ring allreduce's: the slowest ring link as fast as it can
// be (bandwidths on a grid of 1.25× steps, so that measuring noise does not
// decide), then the least time over all links, each link's time that of a
// MiB at its bandwidth plus its round trip — which is what keeps a ring from
// crossing one slow path twice where once will do. Ties go to the order of
// the members as given, then to the lowest members first. It works in
// integers only, so every member that solves the same measures gets the
// same order bit for bit, whatever its CPU. Up to 16 members it is exact;
// above, it improves the given order by moving one member at a time.
func Order(in [][]Link) []int {
	n := len(in)
	ident := make([]int, n)
	for i := range ident {
		ident[i] = i
	}
	if n < 3 {
		return ident
	}
	c := costs(in)
	if c == nil {
		return ident
	}
	best := ident
	if n <= exactOrder {
		best = c.exact()
	} else {
		best = c.improve(ident)
	}
	if c.score(ident) == c.score(best) {
		return ident
	}
	return best
}

// OrderBottleneck is the slowest link's bandwidth (bytes a second) of the
// ring in order, by the measures in: what Order makes as large as it can.
func OrderBottleneck(in [][]Link, order []int) uint64 {
	low := uint64(0)
	for k, to := range order {
		from := order[(k-1+len(order))%len(order)]
		if b := in[to][from].Bandwidth; k == 0 || b < low {
			low = b
		}
	}
	return low
}

// linkCosts is the measures as Order weighs them: each link's bandwidth
// level and time, from i to j at [i*n+j].
type linkCosts struct {
	n     int
	level []int
	time  []uint64
}

// score is an order's worth: higher is better, compared level first.
type score struct {
	level int
	time  uint64
}

func (s score) better(t score) bool {
	return s.level > t.level || s.level == t.level && s.time < t.time
}

// costs reads the measures, with medians standing in for the missing;
// nil if there is no measure at all.
func costs(in [][]Link) *linkCosts {
	n := len(in)
	var bws, rtts []uint64
	for i := range in {
		if len(in[i]) != n {
			return nil
		}
		for j, l := range in[i] {
			if i == j {
				continue
			}
			if l.Bandwidth > 0 {
				bws = append(bws, l.Bandwidth)
			}
			if l.RTT > 0 {
				rtts = append(rtts, l.RTT)
			}
		}
	}
	if len(bws) == 0 {
		return nil
	}
	bwMid, rttMid := median(bws), median(rtts)
	c := &linkCosts{n: n, level: make([]int, n*n), time: make([]uint64, n*n)}
	for to := range in {
		for from, l := range in[to] {
			bw, rtt := l.Bandwidth, l.RTT
			if bw == 0 {
				bw = bwMid
			}
			if rtt == 0 {
				rtt = rttMid
			}
			lv, q := gridLevel(bw)
			_, r := gridLevel(rtt)
			c.level[from*n+to] = lv
			c.time[from*n+to] = (1<<20)*1_000_000_000/q + r
		}
	}
	return c
}

// median is the lower middle of v (0 if empty); v is reordered.
func median(v []uint64) uint64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// gridLevel puts x on a grid of about 1.25× steps (5, 6, 7, 8, 10, 12, …):
// the highest step not above x, and its value. x < 5 is step 0, value 5.
func gridLevel(x uint64) (level int, value uint64) {
	value = 5
	for {
		next := value * 5 / 4
		if next == value {
			next++
		}
		if next > x || next < value {
			return level, value
		}
		level++
		value = next
	}
}

func (c *linkCosts) score(order []int) score {
	s := score{level: int(^uint(0) >> 1)}
	for k, from := range order {
		to := order[(k+1)%len(order)]
		s.level = min(s.level, c.level[from*c.n+to])
		s.time += c.time[from*c.n+to]
	}
	return s
}

// exact finds the highest level at which a ring exists using only links at
// or above it, then the least time among those rings (Held–Karp).
func (c *linkCosts) exact() []int {
	levels := slices.Clone(c.level)
	slices.Sort(levels)
	levels = slices.Compact(levels)
	lo, hi := 0, len(levels)-1 // the lowest level always has a ring: every link
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if c.ringAt(levels[mid]) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return c.leastTime(levels[lo])
}

// ringAt says whether a ring through every member uses only links at or
// above level: the sets of ends of paths from member 0, by the members
// they cover (member 0 always among them, so kept without it).
func (c *linkCosts) ringAt(level int) bool {
	n := c.n
	adj := c.adjacent(level)
	half := 1 << (n - 1)
	ends := make([]uint32, half)
	ends[0] = 1
	for set := range half {
		mask := uint32(set)<<1 | 1
		for e := ends[set]; e != 0; e &= e - 1 {
			j := bits.TrailingZeros32(e)
			for nx := adj[j] &^ mask; nx != 0; nx &= nx - 1 {
				k := bits.TrailingZeros32(nx)
				ends[set|1<<(k-1)] |= 1 << k
			}
		}
	}
	return c.closes(ends[half-1], level)
}

// closes says whether one of the ends can link back to member 0.
func (c *linkCosts) closes(ends uint32, level int) bool {
	for e := ends; e != 0; e &= e - 1 {
		j := bits.TrailingZeros32(e)
		if c.level[j*c.n] >= level {
			return true
		}
	}
	return false
}

// leastTime is the ring of least time using only links at or above level,
// from member 0; lower members first where times tie. Its table holds the
// paths from member 0 by the members they cover (member 0 always among
// them, so a set is kept without it) and the member they end at.
func (c *linkCosts) leastTime(level int) []int {
	n := c.n
	const none = ^uint64(0)
	adj := c.adjacent(level)
	half := 1 << (n - 1) // the sets with member 0, by their other members
	dp := make([]uint64, half*n)
	from := make([]int8, half*n)
	for i := range dp {
		dp[i] = none
	}
	dp[0] = 0 // the path of member 0 alone
	for set := range half {
		mask := uint32(set)<<1 | 1
		row := dp[set*n : set*n+n]
		for e := mask; e != 0; e &= e - 1 {
			j := bits.TrailingZeros32(e)
			d := row[j]
			if d == none {
				continue
			}
			for nx := adj[j] &^ mask; nx != 0; nx &= nx - 1 {
				k := bits.TrailingZeros32(nx)
				at := (set|1<<(k-1))*n + k
				if t := d + c.time[j*n+k]; t < dp[at] {
					dp[at], from[at] = t, int8(j)
				}
			}
		}
	}
	full := half - 1
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
	for k, set := n-1, full; k > 0; k-- {
		order[k] = last
		prev := int(from[set*n+last])
		set &^= 1 << (last - 1)
		last = prev
	}
	return order
}

// adjacent is, for each member, the set of members its links at or above
// level reach (member 0 left out as an end: a path returns to it only to
// close the ring).
func (c *linkCosts) adjacent(level int) []uint32 {
	n := c.n
	adj := make([]uint32, n)
	for i := range n {
		for j := 1; j < n; j++ {
			if i != j && c.level[i*n+j] >= level {
				adj[i] |= 1 << j
			}
		}
	}
	return adj
}

// improve moves one member at a time to the place in the ring that betters
// the order most, until no move betters it: a local search for rings too
// large for the exact table.
func (c *linkCosts) improve(order []int) []int {
	cur := slices.Clone(order)
	s := c.score(cur)
	for range 100 * c.n {
		var best []int
		bestS := s
		for i := 1; i < c.n; i++ {
			rest := slices.Delete(slices.Clone(cur), i, i+1)
			for at := 1; at <= len(rest); at++ {
				if at == i {
					continue
				}
				try := slices.Insert(slices.Clone(rest), at, cur[i])
				if ts := c.score(try); ts.better(bestS) {
					best, bestS = try, ts
				}
			}
		}
		if best == nil {
			break
		}
		cur, s = best, bestS
	}
	return cur
}
