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
