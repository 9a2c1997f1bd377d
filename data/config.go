package data

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Config is the data config users of the older tools already have:
//
//	{
//	  "transforms": [
//	    {"name": "ToTensor", "args": []},
//	    {"name": "Normalize", "args": [[0.5, 0.5, 0.5], [0.5, 0.5, 0.5]]}
//	  ],
//	  "dataset_path": {"train": "path/to/train", "test": "path/to/test"}
//	}
//
// An optional "classes" list names the labels.
//
// A text corpus, for language models, is named instead by "text" (see
// TextSpec), with neither dataset_path nor transforms:
//
//	{"text": {"folder": "/usr/share/games/fortunes"}}
type Config struct {
	Transforms  []TransformSpec `json:"transforms"`
	DatasetPath Paths           `json:"dataset_path"`
	Classes     []string        `json:"classes,omitempty"`
	Text        *TextSpec       `json:"text,omitempty"`
	// Targets, for CSV tables of numbers, names the columns that are float
	// targets (for an mse or bce loss); every other column is a feature.
	Targets []string `json:"targets,omitempty"`
}

// Paths are the train and test datasets (see Open for what a path may name).
type Paths struct {
	Train string `json:"train"`
	Test  string `json:"test"`
}

// ParseConfig reads a data config. An unknown field is an error naming it,
// so that a typo is not silently ignored. Relative dataset paths are taken
// relative to dir (the config file's folder; "" for the working directory).
func ParseConfig(r io.Reader, dir string) (*Config, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var c Config
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("data: config: %w: %w", err, ErrConfig)
	}
	if dec.More() {
		return nil, fmt.Errorf("data: config: more than one JSON value: %w", ErrConfig)
	}
	if c.Text != nil {
		if c.DatasetPath != (Paths{}) || c.Transforms != nil || c.Classes != nil || c.Targets != nil {
			return nil, fmt.Errorf(`data: config: text is a corpus of its own: leave dataset_path, transforms and classes out: %w`, ErrConfig)
		}
		if err := c.Text.check(dir); err != nil {
			return nil, err
		}
		return &c, nil
	}
	if c.DatasetPath.Train == "" {
		return nil, fmt.Errorf(`data: config: dataset_path.train is missing; add "dataset_path": {"train": "...", "test": "..."}: %w`, ErrConfig)
	}
	for _, p := range []*string{&c.DatasetPath.Train, &c.DatasetPath.Test} {
		if *p != "" && !filepath.IsAbs(*p) && dir != "" {
			*p = filepath.Join(dir, *p)
		}
	}
	if c.Targets != nil {
		return &c, c.checkTable()
	}
	if _, err := NewPipeline(c.Transforms); err != nil {
		return nil, err
	}
	return &c, nil
}

// MaxConfigBytes bounds a data config file.
const MaxConfigBytes = 1 << 20

// ReadConfigFile reads a config file of at most limit bytes. A path that
// names no regular file (a device such as /dev/zero, a pipe) or a file
// over the limit is an error, not a hang or all of this machine's memory.
func ReadConfigFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("data: %s is not a regular file (%v): %w", path, st.Mode().Type(), ErrConfig)
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("data: %s is over %d bytes; not a config: %w", path, limit, ErrConfig)
	}
	return b, nil
}

// LoadConfig reads a data config file; relative paths in it are taken from
// the file's folder.
func LoadConfig(path string) (*Config, error) {
	b, err := ReadConfigFile(path, MaxConfigBytes)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(bytes.NewReader(b), filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// Split is one dataset with its transforms, checked to give tensors of one
// shape.
type Split struct {
	*Dataset
	Pipeline *Pipeline
	// C, H, W is the shape of every sample after the transforms; a text
	// split's is 1×1×context.
	C, H, W int
	// Text, for a text corpus, is its part: its samples are windows
	// (Text.Window), and Dataset holds only the source and the 256 byte
	// values as classes.
	Text *Text
	// Table, for a CSV table of numbers, is its rows: a sample is C
	// features (H and W are 1) and then Table.Targets float targets.
	Table *Table

	remote *remote // a served split's fetching; nil for local files
}

// LabelGroups is each sample's label modulo g, for Sampler.Groups
// (shards that differ by label); only a local image split has labels to
// group by.
func (s *Split) LabelGroups(g int) ([]int, error) {
	if s.Text != nil || s.Table != nil || s.remote != nil || s.Dataset == nil || g < 1 {
		return nil, fmt.Errorf("data: %s: shards by label need a local image dataset and at least one shard", s.Describe())
	}
	out := make([]int, s.Len())
	for i := range out {
		out[i] = s.Label(i) % g
	}
	return out, nil
}

// Len is the split's samples: its images, or a text split's windows.
func (s *Split) Len() int {
	if s.Text != nil {
		return s.Text.Windows()
	}
	if s.Table != nil {
		return s.Table.Len()
	}
	return s.Dataset.Len()
}

// Load opens the config's train or test split ("train" or "test") and
// checks every image against the transforms: the first image whose tensor
// would differ in shape from the others is named in the error.
func (c *Config) Load(split string) (*Split, error) {
	if c.Text != nil {
		return c.loadText(split)
	}
	path := c.DatasetPath.Train
	if split == "test" {
		path = c.DatasetPath.Test
	}
	if path == "" {
		return nil, fmt.Errorf("data: config has no dataset_path.%s: %w", split, ErrConfig)
	}
	if c.Targets != nil {
		return c.loadTable(path)
	}
	p, err := NewPipeline(c.Transforms)
	if err != nil {
		return nil, err
	}
	d, err := Open(path, split, c.Classes)
	if err != nil {
		return nil, err
	}
	return NewSplit(d, p)
}

// NewSplit pairs a dataset with transforms and checks the shapes.
func NewSplit(d *Dataset, p *Pipeline) (*Split, error) {
	if d.Len() == 0 {
		return nil, fmt.Errorf("data: %s has no images: %w", d.Source, ErrFormat)
	}
	s := &Split{Dataset: d, Pipeline: p}
	type dims struct{ h, w, c int }
	seen := map[dims]bool{}
	for i := range d.Len() {
		im := d.Image(i)
		k := dims{im.H, im.W, im.C}
		if seen[k] {
			continue
		}
		c, h, w, err := p.OutShape(im.H, im.W, im.C)
		if err != nil {
			return nil, fmt.Errorf("%s (%d×%d×%d): %w", d.Name(i), im.H, im.W, im.C, err)
		}
		if len(seen) == 0 {
			s.C, s.H, s.W = c, h, w
		} else if c != s.C || h != s.H || w != s.W {
			first := d.Image(0)
			hint := ""
			if im.H != first.H || im.W != first.W {
				hint = "; add a Resize (or RandomCrop) so that all images come out the same size"
			}
			return nil, fmt.Errorf("data: %s is %d×%d×%d and becomes %d×%d×%d, but %s becomes %d×%d×%d%s: %w",
				d.Name(i), im.H, im.W, im.C, c, h, w, d.Name(0), s.C, s.H, s.W, hint, ErrFormat)
		}
		seen[k] = true
	}
	return s, nil
}

// Values is how many values one sample has in a batch: C×H×W, and a
// table's targets after them.
func (s *Split) Values() int {
	n := s.C * s.H * s.W
	if s.Table != nil {
		n += s.Table.Targets
	}
	return n
}

// Describe says what a user wants to see on load.
func (s *Split) Describe() string {
	if s.Text != nil {
		if s.Text.Context < 1 { // windows are the model's, which no job has named yet
			return fmt.Sprintf("%s: %d bytes, in windows of the model's context + 1", s.Source, len(s.Text.Bytes))
		}
		return fmt.Sprintf("%s; %d windows of %d bytes", s.Source, s.Text.Windows(), s.Text.Context+1)
	}
	if s.Table != nil {
		return s.Source
	}
	return fmt.Sprintf("%s; transforms: %s; samples become %d×%d×%d", s.Dataset.Describe(), s.Pipeline.Describe(), s.C, s.H, s.W)
}
