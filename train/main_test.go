package train

import (
	"os"
	"testing"
)

// The tests multiply as the program does (train.InstallBLAS).
func TestMain(m *testing.M) {
	InstallBLAS()
	os.Exit(m.Run())
}

// newReplica is NewReplica, or NewLocalReplica where opt is LocalSGD: the
// tests that run every sync mode alike take either.
func newReplica(m Model, opt any, c Collective) *Replica {
	if o, ok := opt.(*LocalSGD); ok {
		return NewLocalReplica(m, o, c)
	}
	return NewReplica(m, opt.(Optimizer), c)
}
