package ptx

import (
	"regexp"
	"strings"
	"testing"
)

// TestTableMatchesModule: every kernel of the table is an entry of the PTX
// with that many 64-bit parameters, and the PTX has no entry the table
// lacks — so the launches, written from the table, fit the module.
func TestTableMatchesModule(t *testing.T) {
	entry := regexp.MustCompile(`(?s)\.visible \.entry (\w+)\((.*?)\)`)
	found := map[string]bool{}
	for _, m := range entry.FindAllStringSubmatch(Module, -1) {
		name, params := m[1], m[2]
		found[name] = true
		want, ok := Kernels[name]
		if !ok {
			t.Errorf("PTX entry %s is not in the table", name)
			continue
		}
		if n := strings.Count(params, ".param"); n != want {
			t.Errorf("%s: %d parameters in the PTX; the table says %d", name, n, want)
		}
		if n := strings.Count(params, ".param .u64"); n != want {
			t.Errorf("%s: %d of its parameters are 64-bit; gorgonia.org/cu passes all as 64-bit words", name, n)
		}
	}
	for name := range Kernels {
		if !found[name] {
			t.Errorf("kernel %s of the table is not in the PTX", name)
		}
	}
	if !strings.Contains(Module, ".target sm_52") {
		t.Error("PTX is not for sm_52; regenerate it with gen.sh")
	}
}
