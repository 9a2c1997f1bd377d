package data

import "testing"

// TestSamplerGroups: with groups, each epoch is still one permutation of
// every sample, the same whatever the world size; with as many ranks as
// groups, rank r trains on group r until the smallest group runs out.
func TestSamplerGroups(t *testing.T) {
	const n, g = 103, 4
	groups := make([]int, n)
	for i := range groups {
		groups[i] = (i * 7) % g
	}
	groups[5] = 0 // group 0 one larger
	for _, world := range []int{1, 2, 4, 3} {
		seen := make([]int, n)
		for r := range world {
			s := Sampler{N: n, World: world, Rank: r, Seed: 9, Shuffle: true, Exact: true, Groups: groups}
			idx, err := s.Indices(2)
			if err != nil {
				t.Fatal(err)
			}
			for k, i := range idx {
				seen[i]++
				if world == g && k < 25 && groups[i] != r {
					t.Errorf("world %d, rank %d: its %d-th sample is of group %d", world, r, k, groups[i])
				}
			}
		}
		for i, c := range seen {
			if c != 1 {
				t.Fatalf("world %d: sample %d seen %d times", world, i, c)
			}
		}
	}
	bad := Sampler{N: 3, World: 1, Groups: []int{0, 1}}
	if _, err := bad.Indices(0); err == nil {
		t.Error("groups for 2 of 3 samples: no error")
	}
}
