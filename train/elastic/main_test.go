package elastic

import (
	"os"
	"testing"

	"github.com/ringtrain/ringtrain/train"
)

// The tests multiply as the program does (train.InstallBLAS).
func TestMain(m *testing.M) {
	train.InstallBLAS()
	os.Exit(m.Run())
}
