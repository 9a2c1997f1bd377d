package data

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadTable: the features in the file's order, the targets after them
// in the config's, whatever their place in the file.
func TestReadTable(t *testing.T) {
	in := "y,a,z,b\n1,2,3,4\n-0.5, 1e-3 ,7,8\n"
	tb, err := ReadTable(strings.NewReader(in), "t.csv", []string{"z", "y"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tb.Columns, []string{"a", "b", "z", "y"}) || tb.Features != 2 || tb.Targets != 2 || tb.Len() != 2 {
		t.Fatalf("columns %q, %d features, %d targets, %d rows", tb.Columns, tb.Features, tb.Targets, tb.Len())
	}
	if got, want := tb.Row(1), []float32{0.001, 8, 7, -0.5}; !slices.Equal(got, want) {
		t.Errorf("row 1 %v; want %v", got, want)
	}
}

// TestReadTableRefuses: every way a table can be wrong is ErrFormat
// (or, for a config naming a target twice, ErrConfig), naming the
// line, column or name that is wrong.
func TestReadTableRefuses(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		targets  []string
		want     string
		sentinel error
	}{
		{"empty file", "", []string{"y"}, "reading the header", ErrFormat},
		{"no rows", "x,y\n", []string{"y"}, "no rows", ErrFormat},
		{"target missing", "x,y\n1,2\n", []string{"w"}, `target column "w" is not in the header`, ErrFormat},
		{"target twice", "x,y\n1,2\n", []string{"y", "y"}, `"y" is named twice in targets`, ErrConfig},
		{"header twice", "x,x,y\n1,2,3\n", []string{"y"}, `column "x" is named twice`, ErrFormat},
		{"all targets", "x,y\n1,2\n", []string{"x", "y"}, "needs a feature", ErrFormat},
		{"not a number", "x,y\n1,2\n1,two\n", []string{"y"}, `line 3 column 2 (y): "two" is not a finite number`, ErrFormat},
		{"NaN", "x,y\nNaN,2\n", []string{"y"}, `line 2 column 1 (x): "NaN"`, ErrFormat},
		{"infinity", "x,y\n1,+Inf\n", []string{"y"}, `"+Inf" is not a finite number`, ErrFormat},
		{"too large for float32", "x,y\n1,1e39\n", []string{"y"}, `"1e39"`, ErrFormat},
		{"ragged", "x,y\n1,2\n3\n", []string{"y"}, "wrong number of fields", ErrFormat},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTable(strings.NewReader(tt.in), "t.csv", tt.targets)
			if !errors.Is(err, tt.sentinel) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "t.csv") {
				t.Errorf("error %v; want %v naming t.csv and saying %q", err, tt.sentinel, tt.want)
			}
		})
	}
}

// TestTableConfig: a data config with targets loads CSV tables whose
// batches carry each row whole — features, then targets — with labels
// 0; what is for images, or a file that is not CSV, is refused.
func TestTableConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "train.csv"), []byte("y,x1,x2\n0.5,1,2\n0.25,3,4\n0.75,5,6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig(strings.NewReader(`{"dataset_path": {"train": "train.csv"}, "targets": ["y"]}`), dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Load("train")
	if err != nil {
		t.Fatal(err)
	}
	if s.Len() != 3 || s.C != 2 || s.Values() != 3 {
		t.Fatalf("%d samples of %d features, %d values; want 3 of 2, 3", s.Len(), s.C, s.Values())
	}
	l := &Loader{Split: s, Sampler: Sampler{N: s.Len(), World: 1, Exact: true}, BatchSize: 2}
	e, err := l.Epoch(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var xs []float32
	var ys []int
	if err := e.Each(func(b *Batch) error {
		xs, ys = append(xs, b.X...), append(ys, b.Y...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := []float32{1, 2, 0.5, 3, 4, 0.25, 5, 6, 0.75}; !slices.Equal(xs, want) || !slices.Equal(ys, []int{0, 0, 0}) {
		t.Errorf("batches %v, labels %v; want %v, zeros", xs, ys, want)
	}
	for _, bad := range []struct{ config, want string }{
		{`{"dataset_path": {"train": "train.csv"}, "targets": []}`, "targets is empty"},
		{`{"dataset_path": {"train": "train.idx"}, "targets": ["y"]}`, "not a .csv file"},
		{`{"dataset_path": {"train": "train.csv"}, "targets": ["y"], "classes": ["a", "b"]}`, "no transforms or classes"},
		{`{"text": {"folder": "."}, "targets": ["y"]}`, "text is a corpus of its own"},
	} {
		if _, err := ParseConfig(strings.NewReader(bad.config), dir); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: error %v; want ErrConfig saying %q", bad.config, err, bad.want)
		}
	}
}

func FuzzReadTable(f *testing.F) {
	f.Add("x,y\n1,2\n3,4\n")
	f.Add("y,a,b\n0.5,1e3,-2\n")
	f.Add("x,y\n1\n")
	f.Add("\"x\",\"y\"\n\"1\",\"NaN\"\n")
	f.Fuzz(func(t *testing.T, in string) {
		tb, err := ReadTable(strings.NewReader(in), "fuzz.csv", []string{"y"})
		if err != nil {
			if !errors.Is(err, ErrFormat) && !errors.Is(err, ErrConfig) {
				t.Fatalf("ReadTable error %v wraps neither ErrFormat nor ErrConfig", err)
			}
			return
		}
		w := tb.Features + tb.Targets
		if tb.Targets != 1 || tb.Features < 1 || len(tb.Rows) == 0 || len(tb.Rows)%w != 0 || len(tb.Columns) != w {
			t.Fatalf("%d features, %d targets, %d values, columns %q", tb.Features, tb.Targets, len(tb.Rows), tb.Columns)
		}
	})
}
