package data

import (
	"fmt"
	"math/rand/v2"
)

// Sampler splits an epoch's samples between ranks with the semantics of
// torch's DistributedSampler: every rank draws the same seeded permutation
// and takes every World-th index from its Rank on, so all ranks get the
// same number of samples.
type Sampler struct {
	N     int // samples in the dataset
	World int // ranks
	Rank  int
	Seed  uint64
	// Shuffle draws a new permutation each epoch from (Seed, epoch);
	// without it the order is 0, 1, 2, …
	Shuffle bool
	// DropLast drops the tail that does not divide among the ranks; the
	// shares are then disjoint and their union is all but that tail.
	// Without it, the permutation is padded by wrapping round to its
	// start, so a few samples are seen twice in the epoch.
	DropLast bool
	// Exact gives every sample to exactly one rank, in shares that differ
	// in size by at most one — for evaluation, whose counts are summed over
	// the ranks once at the end. Training needs DropLast or padding, so
	// that every rank runs the same number of steps.
	Exact bool
	// Skip is how many positions at the start of the epoch's permutation
	// were trained on already: a run resumed in the middle of an epoch
	// shares out the rest. Padding still wraps to the permutation's
	// start, so a run resumed with the world size it stopped with gets the
	// very batches it would have had.
	Skip int
	// Groups, if set, gives each of the N samples a group, 0 to G−1
	// (G = the largest plus one): shards that differ, for tests of what
	// honest members whose data differs send (non-IID). Each epoch's
	// permutation then deals the groups round its positions — position
	// q·G + g holds the q-th sample of group g, in the epoch's shuffled
	// order — until the smallest group runs out, and the rest follow in
	// that order. With G ranks, rank r trains on group r for most of the
	// epoch. It is still one permutation of every sample, independent of
	// the world size, so Skip and re-formations keep their meaning.
	Groups []int
}

func (s Sampler) validate() error {
	if s.World < 1 || s.Rank < 0 || s.Rank >= s.World || s.N < 0 {
		return fmt.Errorf("data: sampler of rank %d in a world of %d over %d samples: want 0 ≤ rank < world", s.Rank, s.World, s.N)
	}
	if s.Skip < 0 || s.Skip > s.N {
		return fmt.Errorf("data: sampler skips %d of %d samples: want 0 ≤ skip ≤ samples", s.Skip, s.N)
	}
	return nil
}

// NumSamples is how many samples this rank gets per epoch (every rank
// the same, unless Exact), after Skip.
func (s Sampler) NumSamples() int {
	n := s.N - s.Skip
	switch {
	case s.Exact:
		return max(0, (n-s.Rank+s.World-1)/s.World)
	case s.DropLast:
		return n / s.World
	}
	return (n + s.World - 1) / s.World
}

// dealGroups reorders perm so that position q·G + g holds the q-th of
// perm's samples in group g, until the smallest group runs out; the rest
// follow in perm's order.
func dealGroups(perm, groups []int) ([]int, error) {
	if len(groups) != len(perm) {
		return nil, fmt.Errorf("data: %d samples' groups for %d samples", len(groups), len(perm))
	}
	g := 0
	for i, v := range groups {
		if v < 0 || v > 1<<16 {
			return nil, fmt.Errorf("data: sample %d in group %d; want 0 to 65536", i, v)
		}
		g = max(g, v+1)
	}
	lists := make([][]int, g)
	for _, i := range perm {
		lists[groups[i]] = append(lists[groups[i]], i)
	}
	short := len(perm)
	for _, l := range lists {
		short = min(short, len(l))
	}
	out := make([]int, 0, len(perm))
	for q := range short {
		for _, l := range lists {
			out = append(out, l[q])
		}
	}
	for _, l := range lists {
		out = append(out, l[short:]...)
	}
	return out, nil
}

// Indices returns this rank's dataset indices for the epoch.
func (s Sampler) Indices(epoch int) ([]int, error) {
	if err := s.validate(); err != nil {
		return nil, err
	}
	var perm []int
	if s.Shuffle {
		perm = rand.New(rand.NewPCG(s.Seed, uint64(epoch))).Perm(s.N)
	} else {
		perm = make([]int, s.N)
		for i := range perm {
			perm[i] = i
		}
	}
	if s.Groups != nil {
		var err error
		if perm, err = dealGroups(perm, s.Groups); err != nil {
			return nil, err
		}
	}
	rest := perm[s.Skip:]
	total := s.NumSamples() * s.World
	if s.Exact {
		total = len(rest)
	}
	for len(rest) < total && s.N > 0 {
		rest = append(rest, perm[:min(total-len(rest), s.N)]...)
	}
	perm = rest[:total]
	out := make([]int, 0, s.NumSamples())
	for i := s.Rank; i < total; i += s.World {
		out = append(out, perm[i])
	}
	return out, nil
}
