package data

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Table is a CSV of numbers: each row a sample, some columns its features
// and the others, named by the data config's targets, the float values a
// regression (MSE) or binary (BCE) loss compares the model's outputs with.
type Table struct {
	Source string
	// Columns names the columns as a sample holds them: the features in
	// the file's order, then the targets in the config's.
	Columns []string
	// Features and Targets count them.
	Features, Targets int
	// Rows holds Len() samples of Features+Targets values, row-major.
	Rows []float32
}

// Len is the table's rows.
func (t *Table) Len() int { return len(t.Rows) / (t.Features + t.Targets) }

// Row is sample i: its features, then its targets.
func (t *Table) Row(i int) []float32 {
	w := t.Features + t.Targets
	return t.Rows[i*w : (i+1)*w]
}

// Bounds on a table, so that a hostile file cannot make rows or columns of
// any size: a row as wide as the widest image, and values a gigabyte.
const (
	maxTableColumns = maxCSVPixels
	maxTableValues  = 1 << 28
)

// ReadTable reads a CSV table: a header naming every column, then one
// sample per row, every field a finite number (strconv's syntax).
// targets names the target columns, each once and not all of them; name
// is used in errors.
func ReadTable(r io.Reader, name string, targets []string) (*Table, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("data: %s: reading the header: %w: %w", name, err, ErrFormat)
	}
	header = slices.Clone(header)
	order, err := tableOrder(header, targets)
	if err != nil {
		return nil, fmt.Errorf("data: %s: %w", name, err)
	}
	t := &Table{Source: name, Features: len(header) - len(targets), Targets: len(targets)}
	for _, c := range order {
		t.Columns = append(t.Columns, header[c])
	}
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil { // csv's own error names the line, and a row of another width
			return nil, fmt.Errorf("data: %s: %w: %w", name, err, ErrFormat)
		}
		if len(t.Rows)+len(rec) > maxTableValues {
			return nil, fmt.Errorf("data: %s line %d: more than %d values: %w", name, line, maxTableValues, ErrFormat)
		}
		for _, c := range order {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[c]), 32)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("data: %s line %d column %d (%s): %q is not a finite number: %w", name, line, c+1, header[c], rec[c], ErrFormat)
			}
			t.Rows = append(t.Rows, float32(v))
		}
	}
	if len(t.Rows) == 0 {
		return nil, fmt.Errorf("data: %s has a header and no rows: %w", name, ErrFormat)
	}
	return t, nil
}

// tableOrder is the header's column indices, features first, then the
// targets in the order given.
func tableOrder(header, targets []string) ([]int, error) {
	if len(header) > maxTableColumns {
		return nil, fmt.Errorf("%d columns; at most %d: %w", len(header), maxTableColumns, ErrFormat)
	}
	at := map[string]int{}
	for i, h := range header {
		if _, dup := at[h]; dup {
			return nil, fmt.Errorf("column %q is named twice in the header: %w", h, ErrFormat)
		}
		at[h] = i
	}
	var order []int
	isTarget := map[int]bool{}
	for _, name := range targets {
		i, ok := at[name]
		if !ok {
			return nil, fmt.Errorf("target column %q is not in the header %q: %w", name, header, ErrFormat)
		}
		if isTarget[i] {
			return nil, fmt.Errorf("target column %q is named twice in targets: %w", name, ErrConfig)
		}
		isTarget[i] = true
	}
	if len(isTarget) == len(header) {
		return nil, fmt.Errorf("every column (%q) is a target; a sample needs a feature: %w", header, ErrFormat)
	}
	for i := range header {
		if !isTarget[i] {
			order = append(order, i)
		}
	}
	for _, name := range targets {
		order = append(order, at[name])
	}
	return order, nil
}

// ReadTableFile reads a CSV table from a file; see ReadTable.
func ReadTableFile(path string, targets []string) (*Table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	return ReadTable(f, path, targets)
}

// checkTable checks a table's config: CSV files, and nothing that is for
// images.
func (c *Config) checkTable() error {
	if len(c.Targets) == 0 {
		return fmt.Errorf(`data: config: targets is empty; name the target columns, "targets": ["y"]: %w`, ErrConfig)
	}
	if c.Transforms != nil || c.Classes != nil {
		return fmt.Errorf("data: config: a table with targets has no transforms or classes; leave them out: %w", ErrConfig)
	}
	for _, p := range []string{c.DatasetPath.Train, c.DatasetPath.Test} {
		if p != "" && !strings.EqualFold(filepath.Ext(p), ".csv") {
			return fmt.Errorf("data: config: targets are columns of a CSV table; %s is not a .csv file: %w", p, ErrConfig)
		}
	}
	return nil
}

// loadTable opens a split of a table.
func (c *Config) loadTable(path string) (*Split, error) {
	t, err := ReadTableFile(path, c.Targets)
	if err != nil {
		return nil, err
	}
	src := fmt.Sprintf("%s (%d rows; features %q; targets %q)", path, t.Len(), t.Columns[:t.Features], t.Columns[t.Features:])
	return &Split{Dataset: &Dataset{Source: src}, Pipeline: &Pipeline{}, C: t.Features, H: 1, W: 1, Table: t}, nil
}
