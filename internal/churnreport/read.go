package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ringtrain/ringtrain/train/trace"
)

// event is one line of events.tsv.
type event struct {
	at        time.Time
	kind      string // start, kill, int, leave, new, restart, exit
	peer, inc int
	rc        int // exit's status
}

// sample is one line of a .metrics file.
type sample struct {
	at              time.Time
	goroutines, fds float64
	residentBytes   float64
}

// proc is one incarnation of a peer: a process the harness started.
type proc struct {
	peer, inc int
	steps     []time.Time // when each step it took part in ended (its optimizer ran)
	trained   []trainedBatch
	summary   *summary // its last line, if it finished the job
	admitted  bool     // it said it was admitted to a running ring
	ended     bool     // it waited as a standby until the job ended
	samples   []sample
}

// trainedBatch is the whole block an applied step trained (the trace's
// "trained" instants): its epoch, its first position in the epoch's
// permutation, and its dataset indices. Every rank of the step records it.
type trainedBatch struct {
	epoch, from int
	index       []int
}

type summary struct {
	Epochs       int     `json:"epochs"`
	WorldSize    int     `json:"world_size"`
	TestAccuracy float64 `json:"test_accuracy"`
	ParamHash    string  `json:"param_hash"`
	// Stage is a pipeline peer's stage (absent: the whole model), whose
	// hash its stage's other replicas share.
	Stage         *int    `json:"stage"`
	SamplesPerSec float64 `json:"samples_per_sec"`
}

// record is a run's folder read.
type record struct {
	events []event
	procs  map[[2]int]*proc
}

func readRun(dir string) (*record, error) {
	r := &record{procs: map[[2]int]*proc{}}
	evs, err := readEvents(filepath.Join(dir, "events.tsv"))
	if err != nil {
		return nil, err
	}
	r.events = evs
	for _, e := range evs {
		key := [2]int{e.peer, e.inc}
		if e.kind == "exit" || r.procs[key] != nil || (e.kind != "start" && e.kind != "restart" && e.kind != "new") {
			continue
		}
		p := &proc{peer: e.peer, inc: e.inc}
		base := filepath.Join(dir, fmt.Sprintf("p%d-%d", e.peer, e.inc))
		if p.steps, p.trained, err = readTrace(base + ".trace.json"); err != nil {
			return nil, err
		}
		if err := readLog(base+".log", p); err != nil {
			return nil, err
		}
		if p.samples, err = readSamples(base + ".metrics"); err != nil {
			return nil, err
		}
		r.procs[key] = p
	}
	return r, nil
}

func readEvents(path string) ([]event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []event
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			return nil, fmt.Errorf("%s:%d: %q: want Unix ms, kind, peer, incarnation", path, n, sc.Text())
		}
		var e event
		var ms int64
		var err error
		if ms, err = strconv.ParseInt(fs[0], 10, 64); err == nil {
			e.at = time.UnixMilli(ms)
			e.kind = fs[1]
			if e.peer, err = strconv.Atoi(fs[2]); err == nil {
				e.inc, err = strconv.Atoi(fs[3])
			}
		}
		if err == nil && e.kind == "exit" {
			if len(fs) < 5 {
				err = fmt.Errorf("an exit without its status")
			} else {
				e.rc, err = strconv.Atoi(fs[4])
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		out = append(out, e)
	}
	slices.SortStableFunc(out, func(a, b event) int { return a.at.Compare(b.at) })
	return out, sc.Err()
}

// readTrace reads when each step of a trace ended, and the batches its
// applied steps trained; a process killed before its trace had a line
// leaves none.
func readTrace(path string) ([]time.Time, []trainedBatch, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	evs, err := trace.Read(f)
	if err != nil {
		if st, _ := f.Stat(); st != nil && st.Size() < 64 {
			return nil, nil, nil // killed before its first events were written
		}
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	start, ok := trace.Start(evs)
	if !ok {
		return nil, nil, fmt.Errorf("%s: no start time", path)
	}
	var batches []trainedBatch
	for _, e := range evs {
		if e.Name != trace.TrainedEvent {
			continue
		}
		b, err := trainedOf(e.Args)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		batches = append(batches, b)
	}
	// A step ends with its optimizer; in DiLoCo's rounds, whose inner
	// steps are local, with its backward pass.
	var out []time.Time
	for _, name := range []string{"optimizer", "forward+backward", "backward"} {
		for _, e := range evs {
			if e.Phase == "X" && e.Name == name {
				out = append(out, time.UnixMicro(start+int64(e.TS+e.Dur)))
			}
		}
		if len(out) > 0 {
			break
		}
	}
	slices.SortFunc(out, time.Time.Compare)
	return out, batches, nil
}

func trainedOf(args map[string]any) (trainedBatch, error) {
	epoch, ok := args["epoch"].(float64)
	from, ok1 := args["from"].(float64)
	ix, ok2 := args["index"].([]any)
	if !ok || !ok1 || !ok2 {
		return trainedBatch{}, fmt.Errorf("a %q event without its epoch, first position and indices: %v", trace.TrainedEvent, args)
	}
	b := trainedBatch{epoch: int(epoch), from: int(from), index: make([]int, len(ix))}
	for i, v := range ix {
		f, ok := v.(float64)
		if !ok {
			return trainedBatch{}, fmt.Errorf("a %q event's index %v", trace.TrainedEvent, v)
		}
		b.index[i] = int(f)
	}
	return b, nil
}

func readLog(path string, p *proc) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var m struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(line, &m) != nil {
			continue // the banner lines before the log
		}
		switch {
		case m.Message == "summary":
			s := &summary{}
			if err := json.Unmarshal(line, s); err != nil {
				return fmt.Errorf("%s: a summary: %w", path, err)
			}
			p.summary = s
		case strings.HasPrefix(m.Message, "admitted to the ring"):
			p.admitted = true
		case strings.HasPrefix(m.Message, "the job ended before this standby was admitted"):
			p.ended = true
		}
	}
	return sc.Err()
}

func readSamples(path string) ([]sample, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []sample
	for n, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		fs := strings.Fields(line)
		if len(fs) != 4 {
			continue // a scrape that failed (the process gone), or none yet
		}
		var v [4]float64
		for i, s := range fs {
			if v[i], err = strconv.ParseFloat(s, 64); err != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, n+1, err)
			}
		}
		out = append(out, sample{at: time.UnixMilli(int64(v[0])), goroutines: v[1], fds: v[2], residentBytes: v[3]})
	}
	return out, nil
}
