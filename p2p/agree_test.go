package p2p

import (
	"errors"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Peers for the machine's tests: the machine never decodes IDs, and these
// sort in the order of their names.
const (
	pa peer.ID = "peer-a"
	pb peer.ID = "peer-b"
	pc peer.ID = "peer-c"
	pd peer.ID = "peer-d"
	pe peer.ID = "peer-e"
)

// msg is one input to an Agreement in a scripted test.
type msg struct {
	from   peer.ID
	prop   []peer.ID
	ready  bool
	formed bool
	dead   bool // Unreachable(from) instead of a proposal
	gen    uint64
}

func feed(t *testing.T, a *Agreement, ms []msg) []error {
	t.Helper()
	var errs []error
	for _, m := range ms {
		if m.dead {
			a.Unreachable(m.from)
			continue
		}
		gen := m.gen
		if gen == 0 {
			gen = a.Generation()
		}
		if err := a.Step(m.from, Proposal{Gen: gen, Members: m.prop, Ready: m.ready, Formed: m.formed}); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

func TestAgreementJoin(t *testing.T) {
	abc, abcd := []peer.ID{pa, pb, pc}, []peer.ID{pa, pb, pc, pd}
	for _, tc := range []struct {
		name     string
		self     peer.ID
		verified []peer.ID
		msgs     []msg
		minSize  int       // the job's min_world_size
		maxSize  int       // the job's max_world_size
		bad      int       // how many messages ErrBadProposal refuses
		formed   []peer.ID // nil: not formed
		standby  bool
		proposal []peer.ID // what self proposes at the end
	}{
		{name: "all propose, then all ready: formed", self: pa, verified: abc,
			msgs:   []msg{{from: pb, prop: abc}, {from: pc, prop: abc}, {from: pb, prop: abc, ready: true}, {from: pc, prop: abc, ready: true}},
			formed: abc, proposal: abc},
		{name: "all propose, none ready yet: ready, not formed", self: pa, verified: abc,
			msgs: []msg{{from: pb, prop: abc}, {from: pc, prop: abc}}, proposal: abc},
		{name: "too few verified: no proposal", self: pa, verified: []peer.ID{pa, pb}},
		{name: "a peer twice in a proposal is refused, not used", self: pa, verified: abc,
			msgs: []msg{{from: pb, prop: []peer.ID{pa, pb, pb}, ready: true}, {from: pc, prop: abc, ready: true}},
			bad:  1, proposal: abc},
		{name: "an unsorted proposal is refused", self: pa, verified: abc,
			msgs: []msg{{from: pb, prop: []peer.ID{pb, pa, pc}}}, bad: 1, proposal: abc},
		{name: "a proposal of the wrong size is refused", self: pa, verified: abc,
			msgs: []msg{{from: pb, prop: []peer.ID{pa, pb}, ready: true}}, bad: 1, proposal: abc},
		{name: "ready on nothing is refused", self: pa, verified: abc,
			msgs: []msg{{from: pb, ready: true}}, bad: 1, proposal: abc},
		{name: "a ring with a peer this one never verified does not form", self: pa, verified: []peer.ID{pa, pb},
			msgs: []msg{{from: pb, prop: abc, ready: true}}},
		{name: "the others all ready without this peer: standby", self: pd, verified: []peer.ID{pa, pb, pc, pd},
			msgs:    []msg{{from: pa, prop: abc, ready: true}, {from: pb, prop: abc, ready: true}, {from: pc, prop: abc, ready: true}},
			standby: true, proposal: abc},
		{name: "another generation is ignored", self: pa, verified: abc,
			msgs: []msg{{from: pb, prop: abc, ready: true, gen: 2}, {from: pc, prop: abc, ready: true, gen: 2}}, proposal: abc},
		{name: "an unverified sender is ignored", self: pa, verified: []peer.ID{pa, pb},
			msgs: []msg{{from: pc, prop: abc, ready: true}}},
		// c was lost; a and b re-formed as generation 2. c, started again
		// with the same identity, hears the first ring's statements, passed
		// on, and then b's of generation 2: it waits to be admitted, and
		// never forms the first ring again.
		{name: "a later generation trains without this peer: standby, not the ended ring", self: pc, verified: abc,
			msgs: []msg{{from: pa, prop: abc, ready: true, formed: true}, {from: pb, prop: abc, ready: true, formed: true},
				{from: pb, prop: []peer.ID{pa, pb}, ready: true, formed: true, gen: 2}, {from: pa, prop: []peer.ID{pa, pb}, ready: true, formed: true, gen: 2}},
			standby: true, proposal: abc},
		// A peer that knows the job claims a ring of a later generation
		// that trains without the others. Before claims were proved, one
		// such hello held every honest peer as a standby.
		{name: "one member's word that a later ring trains is not enough", self: pc, verified: abc,
			msgs:     []msg{{from: pb, prop: []peer.ID{pa, pb}, ready: true, formed: true, gen: 2}},
			proposal: abc},
		{name: "a liar's ring of itself alone is refused below min_world_size", self: pc, verified: abc, minSize: 2,
			msgs: []msg{{from: pb, prop: []peer.ID{pb}, ready: true, formed: true, gen: 7}}, bad: 1, proposal: abc},
		{name: "a later ring grown by admissions past world_size is taken", self: pe, verified: abcd, maxSize: 4,
			msgs: []msg{{from: pa, prop: abcd, ready: true, formed: true, gen: 3}, {from: pb, prop: abcd, ready: true, formed: true, gen: 3},
				{from: pc, prop: abcd, ready: true, formed: true, gen: 3}, {from: pd, prop: abcd, ready: true, formed: true, gen: 3}},
			standby: true, proposal: abc},
		{name: "a later ring past max_world_size is refused", self: pe, verified: abcd,
			msgs: []msg{{from: pa, prop: abcd, ready: true, formed: true, gen: 3}}, bad: 1, proposal: abc},
		{name: "a ring of a generation far ahead is refused", self: pc, verified: abc,
			msgs: []msg{{from: pb, prop: []peer.ID{pb}, ready: true, formed: true, gen: 1 << 62}}, bad: 1, proposal: abc},
		{name: "one peer's word that the first ring formed is not enough", self: pd, verified: []peer.ID{pa, pb, pc, pd},
			msgs:     []msg{{from: pa, prop: abc, ready: true, formed: true}},
			proposal: abc},
		{name: "a first ring naming a peer never verified is no claim", self: pd, verified: []peer.ID{pa, pb, pd},
			msgs:     []msg{{from: pa, prop: abc, ready: true, formed: true}, {from: pb, prop: abc, ready: true, formed: true}},
			proposal: []peer.ID{pa, pb, pd}},
		{name: "a later generation's ring of the wrong shape is refused", self: pc, verified: abc,
			msgs: []msg{{from: pb, prop: []peer.ID{pb, pa}, ready: true, formed: true, gen: 3}}, bad: 1, proposal: abc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewJoinAgreement(tc.self, Job{WorldSize: 3, MinWorldSize: tc.minSize, MaxWorldSize: tc.maxSize}, 0)
			for _, p := range tc.verified {
				a.Verified(p)
			}
			errs := feed(t, a, tc.msgs)
			for _, err := range errs {
				if !errors.Is(err, ErrBadProposal) {
					t.Errorf("Step: %v; want ErrBadProposal or nil", err)
				}
			}
			if len(errs) != tc.bad {
				t.Errorf("%d proposals refused (%v); want %d", len(errs), errs, tc.bad)
			}
			d := a.Decide()
			switch {
			case tc.formed != nil && (d.Formed == nil || !slices.Equal(d.Formed.Members, tc.formed) || d.Formed.Members[d.Formed.Rank] != tc.self):
				t.Errorf("Decide = %+v; want %v formed", d, tc.formed)
			case tc.formed == nil && d.Formed != nil:
				t.Errorf("Decide formed %+v; want nothing formed", d.Formed)
			case tc.standby != errors.Is(d.Err, ErrStandby):
				t.Errorf("Decide error %v; want standby %v", d.Err, tc.standby)
			}
			if got := a.Proposal().Members; !slices.Equal(got, tc.proposal) {
				t.Errorf("proposes %v; want %v", got, tc.proposal)
			}
		})
	}
}

// TestAgreementGivesUpARingAMemberLeft: ready on a ring, a peer sees one of
// its members ready on another; it gives its own up.
func TestAgreementGivesUpARingAMemberLeft(t *testing.T) {
	a := NewJoinAgreement(pa, Job{WorldSize: 2}, 0)
	for _, p := range []peer.ID{pb, pc} {
		a.Verified(p)
	}
	ab := []peer.ID{pa, pb}
	feed(t, a, []msg{{from: pb, prop: ab}})
	if a.Decide(); !slices.Equal(a.Ready(), ab) {
		t.Fatalf("ready on %v; want %v", a.Ready(), ab)
	}
	feed(t, a, []msg{{from: pb, prop: []peer.ID{pb, pc}, ready: true}})
	if d := a.Decide(); d.Formed != nil || a.Ready() != nil {
		t.Errorf("after a member went ready on another ring: %+v, ready on %v; want neither", d, a.Ready())
	}
}

// TestAgreementDisprovedClaim: a standby whose claimed ring never showed
// itself takes the claim back: no longer a standby, the claim's members
// forgotten, and the same claim said again not believed.
func TestAgreementDisprovedClaim(t *testing.T) {
	a := NewJoinAgreement(pc, Job{WorldSize: 2, MinWorldSize: 2}, 0)
	for _, p := range []peer.ID{pa, pb, pd} {
		a.Verified(p)
	}
	ab := []peer.ID{pa, pb}
	lie := []msg{{from: pa, prop: ab, ready: true, formed: true, gen: 9}, {from: pb, prop: ab, ready: true, formed: true, gen: 9}}
	feed(t, a, lie)
	if d := a.Decide(); !errors.Is(d.Err, ErrStandby) {
		t.Fatalf("Decide = %+v; want standby on the claim", d)
	}
	c := a.Claim()
	if c == nil || c.Gen != 9 || !slices.Equal(c.Members, ab) {
		t.Fatalf("Claim = %+v; want generation 9 of %v", c, ab)
	}
	a.Disprove(c)
	if a.Verified(pa) || a.Candidate(pb) {
		t.Error("a member of a disproved claim is a candidate again without a hello of its own")
	}
	feed(t, a, lie) // passed on again
	feed(t, a, []msg{{from: pd, prop: []peer.ID{pc, pd}}})
	if d := a.Decide(); d.Err != nil || a.Claim() != nil || !slices.Equal(a.Ready(), []peer.ID{pc, pd}) {
		t.Errorf("after the claim was disproved and passed on again: %+v, claim %+v, ready on %v; want no standby, ready on [c d]", d, a.Claim(), a.Ready())
	}
	a.Answered(pa) // it says hello itself, and the same lie
	a.Answered(pb)
	feed(t, a, lie)
	if c := a.Claim(); c != nil {
		t.Errorf("a disproved claim said again by its makers is believed: %+v", c)
	}
}

// TestAgreementJoinBounded: a first formation remembers at most its limit
// of peers.
func TestAgreementJoinBounded(t *testing.T) {
	a := NewJoinAgreement(pa, Job{WorldSize: 2}, 3)
	got := []bool{a.Verified(pb), a.Verified(pc), a.Verified(pd)}
	if !slices.Equal(got, []bool{true, true, false}) {
		t.Errorf("Verified over a limit of 3 = %v; want the third refused", got)
	}
	a.Forget(pb)
	if !a.Verified(pd) {
		t.Error("a forgotten peer's room is not free again")
	}
}

func TestAgreementReform(t *testing.T) {
	abcd := []peer.ID{pa, pb, pc, pd}
	for _, tc := range []struct {
		name    string
		min     int
		gone    []peer.ID
		msgs    []msg
		bad     int
		formed  []peer.ID
		tooFew  bool
		waiting bool // no proposal yet: members not heard from
	}{
		{name: "one dead, the others agree", min: 3,
			msgs: []msg{{from: pd, dead: true},
				{from: pb, prop: []peer.ID{pa, pb, pc}, ready: true}, {from: pc, prop: []peer.ID{pa, pb, pc}, ready: true}},
			formed: []peer.ID{pa, pb, pc}},
		{name: "a member not heard from is waited for", min: 2,
			msgs: []msg{{from: pb, prop: []peer.ID{pa, pb}, ready: true}}, waiting: true},
		{name: "too few left", min: 3,
			msgs:   []msg{{from: pc, dead: true}, {from: pd, dead: true}, {from: pb}},
			tooFew: true, waiting: true},
		{name: "a leaver stays out, whatever it says", min: 2, gone: []peer.ID{pd},
			msgs: []msg{{from: pd, prop: abcd, ready: true}, {from: pb, prop: []peer.ID{pa, pb, pc}, ready: true},
				{from: pc, prop: []peer.ID{pa, pb, pc}, ready: true}},
			formed: []peer.ID{pa, pb, pc}},
		{name: "a proposal with a gone peer is refused", min: 2, gone: []peer.ID{pd},
			msgs: []msg{{from: pb, prop: abcd}, {from: pc, dead: true}}, bad: 1, waiting: true},
		{name: "a stranger to the old ring is refused", min: 2,
			msgs: []msg{{from: pb, prop: []peer.ID{pa, pb, "peer-x"}}}, bad: 1, waiting: true},
		{name: "a member unreachable, then answering after all, is back", min: 4,
			msgs: []msg{{from: pd, dead: true}, {from: pd, prop: abcd, ready: true},
				{from: pb, prop: abcd, ready: true}, {from: pc, prop: abcd, ready: true}},
			formed: abcd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := NewReformAgreement(pa, 2, abcd, tc.min, tc.gone)
			errs := feed(t, a, tc.msgs)
			if len(errs) != tc.bad {
				t.Errorf("%d proposals refused (%v); want %d", len(errs), errs, tc.bad)
			}
			d := a.Decide()
			if d.Formed == nil && d.Err == nil {
				d = a.Decide() // ready now, perhaps: decide again
			}
			switch {
			case tc.formed != nil && (d.Formed == nil || !slices.Equal(d.Formed.Members, tc.formed) || d.Formed.Generation != 2):
				t.Errorf("Decide = %+v (error %v); want %v formed in generation 2", d.Formed, d.Err, tc.formed)
			case tc.formed == nil && d.Formed != nil:
				t.Errorf("Decide formed %+v; want nothing formed", d.Formed)
			case tc.tooFew != errors.Is(d.Err, ErrTooFew):
				t.Errorf("Decide error %v; want ErrTooFew %v", d.Err, tc.tooFew)
			case tc.waiting != (a.Proposal().Members == nil):
				t.Errorf("proposes %v; want waiting %v", a.Proposal().Members, tc.waiting)
			}
		})
	}
}
