package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
)

// DefaultSize is how many starts a Log keeps unless told otherwise.
const DefaultSize = 20

// maxFile bounds what Open reads: a ring of DefaultSize starts of a few
// dozen steps each is a few tens of KiB.
const maxFile = 4 << 20

// Start is one start of a lifecycle, as the history keeps it.
type Start struct {
	// Began is when the start began.
	Began time.Time `json:"began"`
	// Outcome is the lifecycle's state once the start was over: serving,
	// failed, or stopped (drained during the start).
	Outcome string `json:"outcome"`
	// Took is how long the start took, to serving or to its failure.
	Took time.Duration `json:"took"`
	// Steps are its phases and the background tasks they deferred.
	Steps []Step `json:"steps"`
}

// Step is one phase or background task of a start.
type Step struct {
	// Name is the phase's or task's name; Task says which it is.
	Name string `json:"name"`
	Task bool   `json:"task,omitempty"`
	// Took is from its first attempt's start to its end.
	Took time.Duration `json:"took"`
	// Attempts is a phase's attempts (1 for a task).
	Attempts int `json:"attempts"`
	// Total and Unit are its progress total, when it reported one.
	Total int64  `json:"total,omitempty"`
	Unit  string `json:"unit,omitempty"`
	// Outcome is its final state: succeeded, failed, cancelled, skipped.
	Outcome string `json:"outcome"`
}

// file is the history's file: a version, so that a later layout is read
// as unknown rather than wrongly, and the ring, oldest first.
type file struct {
	Version int     `json:"version"`
	Starts  []Start `json:"starts"`
}

const version = 1

// Log is the history of a lifecycle's starts, kept in one file. It is safe
// for concurrent use.
type Log struct {
	path string
	size int

	// usual is what each step took over the starts Open read, those
	// before this process's, which Usual compares it with. Never changed
	// after Open.
	usual map[stepKey]Usual

	mu     sync.Mutex
	starts []Start // oldest first, at most size
}

// Open reads the history at path, keeping at most size starts (DefaultSize
// when size ≤ 0). A missing file is an empty history. A file that cannot
// be read as one (damaged, of another version, not a regular file) is an
// empty history too, which the next Add replaces: Open then returns the
// Log with an error saying what was wrong, for the caller to log, never
// instead of it.
func Open(path string, size int) (*Log, error) {
	if size <= 0 {
		size = DefaultSize
	}
	l := &Log{path: path, size: size}
	starts, err := read(path)
	if err != nil {
		return l, fmt.Errorf("start history %s: %w; starting a new one", path, err)
	}
	if len(starts) > size {
		starts = starts[len(starts)-size:]
	}
	l.starts, l.usual = starts, usualOf(starts)
	return l, nil
}

// read reads the ring at path; a missing file is an empty one.
func read(path string) ([]Start, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open: %w", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return nil, fmt.Errorf("stat: %w", err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%s)", st.Mode().Type())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxFile+1))
	if err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	if len(b) > maxFile {
		return nil, fmt.Errorf("larger than %d bytes", maxFile)
	}
	var h file
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("damaged: %w", err)
	}
	if h.Version != version {
		return nil, fmt.Errorf("version %d, this build reads %d", h.Version, version)
	}
	return h.Starts, nil
}

// Starts returns a copy of the starts kept, oldest first.
func (l *Log) Starts() []Start {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.starts)
}

// Add appends s to the ring, dropping the oldest start beyond the Log's
// size, and writes the ring to its file: to a new file in the same
// directory, synced, then renamed over the old one. The Log holds s even
// when the write fails.
func (l *Log) Add(s Start) error {
	l.mu.Lock()
	l.starts = append(l.starts, s)
	if len(l.starts) > l.size {
		l.starts = slices.Delete(l.starts, 0, len(l.starts)-l.size)
	}
	b, err := json.Marshal(file{Version: version, Starts: l.starts})
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("start history: encode: %w", err)
	}
	return writeFile(l.path, b)
}

// Replace swaps the ring's newest start for s, as Add would have written
// it: for a start recorded when it served, whose background tasks ended
// later. Without a start kept, it adds s.
func (l *Log) Replace(s Start) error {
	l.mu.Lock()
	if n := len(l.starts); n > 0 && l.starts[n-1].Began.Equal(s.Began) {
		l.starts = l.starts[:n-1]
	}
	l.mu.Unlock()
	return l.Add(s)
}

// writeFile writes b to path through a new file renamed over it. The new
// file is made exclusively and opened without following a link, so a
// name planted in the directory is never written through.
func writeFile(path string, b []byte) error {
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%s.%d.tmp", filepath.Base(path), os.Getpid()))
	_ = os.Remove(tmp) // one a crash of this pid's earlier image left
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("start history: create %s: %w", tmp, err)
	}
	_, werr := f.Write(b)
	if werr == nil {
		werr = f.Sync()
	}
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp, path)
	}
	if werr != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("start history: write %s: %w", path, werr)
	}
	return nil
}

// StartOf is the start s shows, as the history keeps it: its phases and
// tasks that began, with how long each took as of now for those still
// running.
func StartOf(s lifecycle.Snapshot, now time.Time) Start {
	out := Start{Began: s.Started, Outcome: string(s.State)}
	end := now
	for _, h := range s.History {
		if h.State == lifecycle.StateServing || h.State == lifecycle.StateFailed || h.State == lifecycle.StateDraining {
			// The first of these ends the start: served, failed, or
			// drained while it ran.
			end, out.Outcome = h.At, string(h.State)
			if h.State == lifecycle.StateDraining {
				out.Outcome = "stopped"
			}
			break
		}
	}
	if !s.Started.IsZero() {
		out.Took = end.Sub(s.Started)
	}
	for _, p := range s.Phases {
		if p.Started.IsZero() {
			continue
		}
		out.Steps = append(out.Steps, Step{Name: p.Name, Took: took(p.Started, p.Ended, now), Attempts: p.Attempts,
			Total: p.Progress.Total, Unit: p.Progress.Unit, Outcome: string(p.State)})
	}
	for _, t := range s.Tasks {
		if t.Started.IsZero() {
			continue
		}
		out.Steps = append(out.Steps, Step{Name: t.Name, Task: true, Took: took(t.Started, t.Ended, now), Attempts: 1,
			Total: t.Progress.Total, Unit: t.Progress.Unit, Outcome: string(t.State)})
	}
	return out
}

func took(started, ended, now time.Time) time.Duration {
	if ended.IsZero() {
		return now.Sub(started)
	}
	return ended.Sub(started)
}
