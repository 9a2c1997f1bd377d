package train

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// inSync is what each rank says at CheckInSync: its parameters' hash and
// its compute seconds since the last check.
type inSync struct {
	Hash    string  `json:"hash"`
	Compute float64 `json:"compute"`
}

// maxInSyncBytes bounds an inSync's encoding.
const maxInSyncBytes = 128

// CheckInSync compares every rank's parameter hash through the collective.
// Ranks that differ from the most (the lowest rank's hash on a tie) are
// named; the error is a *LiarError, though a bug could cause it as well as
// a lie.
//
// Each rank's row also carries its compute time since the last check, so
// every rank learns, in the same allreduce, which ranks are slow
// (RankCompute, Stragglers).
func (r *Replica) CheckInSync(ctx context.Context) error {
	mine := &inSync{Hash: paramHash(r.ParamHash()), Compute: (r.Stats.Compute - r.checkedCompute).Seconds()}
	states, bad, err := gatherMsgs(ctx, r.Coll, mine, maxInSyncBytes)
	if err != nil {
		return fmt.Errorf("%w: comparing parameter hashes: %w", ErrCollective, err)
	}
	for k, s := range states {
		if s == nil || !validHash(s.Hash) {
			bad = append(bad, k)
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return &LiarError{Ranks: slices.Compact(bad), Why: "their parameter hashes are missing or malformed"}
	}
	r.checkedCompute = r.Stats.Compute
	r.rankCompute = r.rankCompute[:0]
	for _, s := range states {
		v := s.Compute
		if !(v >= 0 && v < 1e12) { // another rank's garbage: no figure
			v = 0
		}
		r.rankCompute = append(r.rankCompute, v)
	}
	all := make([]int, len(states))
	for k := range all {
		all[k] = k
	}
	odd, majority := oddOnes(all, func(k int) string { return states[k].Hash })
	switch {
	case len(odd) > 0 && majority:
		return &LiarError{Ranks: odd, Why: "replicas out of step: they hold other parameters than most ranks"}
	case len(odd) > 0:
		return fmt.Errorf("train: replicas out of step: ranks %v hold other parameters than rank 0, and no majority tells which are right", odd)
	}
	return nil
}

// RankCompute returns every rank's compute seconds (forward and backward)
// between the last two CheckInSync calls — an epoch, in Run — by rank.
func (r *Replica) RankCompute() []float64 { return slices.Clone(r.rankCompute) }

// Stragglers returns the ranks whose compute took more than 1.2 times the
// median of all ranks' (by RankCompute), slowest first: the ones the
// others wait for at every allreduce.
func (r *Replica) Stragglers() []int { return stragglers(r.rankCompute) }

func stragglers(times []float64) []int {
	if len(times) < 2 {
		return nil
	}
	sorted := slices.Clone(times)
	slices.Sort(sorted)
	median := sorted[len(sorted)/2]
	if len(sorted)%2 == 0 {
		median = (sorted[len(sorted)/2-1] + sorted[len(sorted)/2]) / 2
	}
	var out []int
	for k, v := range times {
		if v > 1.2*median {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b int) int { return cmp.Compare(times[b], times[a]) })
	return out
}

// oddOnes returns the ranks whose key differs from the one most ranks
// hold (the lowest rank's, on a tie), in order, and whether that one is
// held by more than half of them — without which nobody can tell who is
// right.
func oddOnes[K comparable](ranks []int, key func(int) K) ([]int, bool) {
	count := map[K]int{}
	for _, k := range ranks {
		count[key(k)]++
	}
	var best K
	n := 0
	for _, k := range ranks {
		if c := count[key(k)]; c > n {
			best, n = key(k), c
		}
	}
	var odd []int
	for _, k := range ranks {
		if key(k) != best {
			odd = append(odd, k)
		}
	}
	return odd, 2*n > len(ranks)
}
