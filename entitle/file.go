package entitle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.yaml.in/yaml/v3"
)

// FileOptions configure a File.
type FileOptions struct {
	// Poll is how often the file's modification time, size and identity
	// are checked for a change (default 1s; negative: never, and the
	// owner calls Reload).
	Poll time.Duration
	// OnError is told of every reload that failed (the last good entries
	// stay in use); nil ignores them.
	OnError func(error)
	// Show is how an error names a value (default: as it is): a
	// fingerprint where values are secrets (API keys).
	Show func(value string) string
}

// defaultPoll is FileOptions.Poll's default.
const defaultPoll = time.Second

// File is a Source that reads a JSON or YAML file (by its extension: .yaml
// or .yml is YAML, anything else JSON) mapping each value to its entry:
//
//	{"acme": {"plan": "enterprise", "limits": [{"count": 100, "per": "h"}], "region": "eu"}}
//
// It keeps the whole file in memory and reloads it when it changes; a
// lookup is a map read.
type File struct {
	path    string
	yaml    bool
	onError func(error)
	showFn  func(string) string

	entries atomic.Pointer[map[string]Entitlement]

	mu   sync.Mutex  // serialises loads
	seen os.FileInfo // the file as last loaded (or tried)

	stop      chan struct{} // closed by Close
	done      chan struct{} // closed when the poller has returned
	closeOnce sync.Once
}

// NewFile loads path, failing if it cannot be read or parsed, and then
// polls it for changes every opts.Poll until Close.
func NewFile(path string, opts FileOptions) (*File, error) {
	ext := strings.ToLower(filepath.Ext(path))
	f := &File{
		path:    path,
		yaml:    ext == ".yaml" || ext == ".yml",
		onError: opts.OnError,
		showFn:  opts.Show,
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if err := f.load(); err != nil {
		return nil, err
	}
	poll := opts.Poll
	if poll == 0 {
		poll = defaultPoll
	}
	if poll < 0 {
		close(f.done)
		return f, nil
	}
	go f.poll(poll)
	return f, nil
}

// Lookup returns value's entry; it never fails.
func (f *File) Lookup(_ context.Context, value string) (Entitlement, bool, error) {
	e, ok := (*f.entries.Load())[value]
	return e, ok, nil
}

// Reload reads the file now, whether or not it changed. On success lookups
// see the new entries at once; on failure they keep the last good ones and
// the error, returned, is also given to OnError.
func (f *File) Reload() error {
	err := f.load()
	if err != nil && f.onError != nil {
		f.onError(err)
	}
	return err
}

// Close stops polling. It is safe to call more than once.
func (f *File) Close() error {
	f.closeOnce.Do(func() { close(f.stop) })
	<-f.done
	return nil
}

// poll reloads the file whenever its identity, size or modification time
// differs from the last load's, until Close.
func (f *File) poll(every time.Duration) {
	defer close(f.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		if f.changed() {
			_ = f.Reload() // Reload reports to OnError
		}
	}
}

// changed reports whether the file differs from the last load's. A file
// that cannot be stat'ed counts as changed, so that the failure is
// reported (once: load remembers it).
func (f *File) changed() bool {
	info, err := os.Stat(f.path)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err != nil:
		return f.seen != nil
	case f.seen == nil:
		return true
	default:
		return !os.SameFile(info, f.seen) || info.Size() != f.seen.Size() || !info.ModTime().Equal(f.seen.ModTime())
	}
}

// load reads and parses the file and, if both succeed, swaps its entries
// in. Whatever the outcome, the file as stat'ed before the read becomes
// the one seen, so a bad file is reported once, not at every poll.
func (f *File) load() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	info, err := os.Stat(f.path)
	if err != nil {
		f.seen = nil
		return fmt.Errorf("entitle: %w", err)
	}
	f.seen = info
	data, err := os.ReadFile(f.path)
	if err != nil {
		return fmt.Errorf("entitle: %w", err)
	}
	entries, err := f.parse(data)
	if err != nil {
		return fmt.Errorf("entitle: %s: %w", f.path, err)
	}
	f.entries.Store(&entries)
	return nil
}

// show is how errors name value.
func (f *File) show(value string) string {
	if f.showFn != nil {
		return f.showFn(value)
	}
	return value
}

// parse reads the file's entries, reporting every bad one (by value, in
// order), not only the first.
func (f *File) parse(data []byte) (map[string]Entitlement, error) {
	raws, err := f.rawEntries(data)
	if err != nil {
		return nil, err
	}
	entries := make(map[string]Entitlement, len(raws))
	var errs []error
	for _, value := range slices.Sorted(maps.Keys(raws)) {
		e, err := parseEntry(raws[value])
		if err != nil {
			errs = append(errs, fmt.Errorf("value %q: %w", f.show(value), err))
			continue
		}
		entries[value] = e
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return entries, nil
}

// rawEntries splits the file into each value's entry, as JSON. A YAML
// file's entries are converted, so that both formats are parsed alike.
func (f *File) rawEntries(data []byte) (map[string]json.RawMessage, error) {
	var raws map[string]json.RawMessage
	if !f.yaml {
		if err := json.Unmarshal(data, &raws); err != nil {
			return nil, fmt.Errorf("want a JSON object mapping each value to its entry: %w", err)
		}
		if raws == nil {
			return nil, errors.New("want a JSON object mapping each value to its entry, not null")
		}
		return raws, nil
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("want a YAML mapping of each value to its entry: %w", err)
	}
	if doc == nil {
		return nil, errors.New("want a YAML mapping of each value to its entry; the file is empty")
	}
	raws = make(map[string]json.RawMessage, len(doc))
	for value, v := range doc {
		raw, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("value %q: %w", f.show(value), err)
		}
		raws[value] = raw
	}
	return raws, nil
}
