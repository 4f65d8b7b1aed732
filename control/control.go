// Package control holds the runtime state of a running Cascade: the
// per-value limit overrides and per-tree modes an operator sets through the
// admin API, kept in the store the limits live in, so that every instance
// sharing it applies them.
//
// A Runtime holds the state as an immutable Snapshot behind an atomic
// pointer, and calls its subscribers with each new one. The request path
// never reads the store for it: a handler compiles each snapshot into its
// trees when it arrives (see package hierarchy's Tier.SetRuntime).
//
// # How a change reaches every instance
//
// The state is kept in a Backend: in the process (the memory store's), or
// in Redis, as one hash and a version counter that every change increments
// in the same script (lua/control.lua). Each Runtime polls the version
// (one GET, every Poll: 4 a second by default) and reloads the hash when it
// moved. A change is so applied everywhere within Poll plus a round trip.
//
// Why poll a version rather than subscribe (Redis pub/sub): a message sent
// while an instance is disconnected is lost, and pub/sub has no replay, so
// an instance would still have to reload the whole state after every
// reconnection, and at start. Reloading on a version change is that one
// mechanism, used for everything: start, restart, reconnection, change. It
// works unchanged on Sentinel and on a Cluster (both keys share a hash tag;
// Cluster pub/sub would broadcast to every node). It costs a few GETs a
// second per instance, off the request path.
//
// # Expiry
//
// An override may expire. An expired override is never in a snapshot: at
// each poll the Runtime checks the earliest expiry and, once it has passed,
// publishes a snapshot without it (the memory backend too), then removes it
// from the backend, unless it was replaced meanwhile.
package control

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// Override replaces a tier's limits for one value of its key, at runtime,
// as a value block of the configuration does (and wins over one).
type Override struct {
	Tree  string `json:"tree"`
	Tier  string `json:"tier"`
	Value string `json:"value"` // as clients send it, unescaped
	// Limits replace the tier's; Unlimited exempts the value from the
	// tier instead. One of the two.
	Limits    []*hierarchy.Limit `json:"limits,omitempty"`
	Unlimited bool               `json:"unlimited,omitempty"`
	// Expires, when set, is when the override goes by itself.
	Expires time.Time `json:"expires,omitzero"`
	// Note says who set it and why.
	Note    string    `json:"note,omitempty"`
	Updated time.Time `json:"updated"`
}

// Mode is a tree's mode set at runtime: "enforce", "warn" or "shadow".
type Mode struct {
	Tree    string    `json:"tree"`
	Mode    string    `json:"mode"`
	Note    string    `json:"note,omitempty"`
	Updated time.Time `json:"updated"`
}

// Limits on what is stored: a note is a sentence, a value a key.
const (
	maxNote  = 1024
	maxValue = 16 << 10
)

// InvalidError is the error of a change that is not valid: the caller's to
// fix (the admin API answers 400).
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &InvalidError{fmt.Sprintf(format, args...)}
}

// Snapshot is the runtime state at one moment. It is immutable: callers
// must not change it, nor its overrides and modes.
type Snapshot struct {
	overrides []*Override // sorted by tree, tier, value
	modes     []*Mode     // sorted by tree
	byKey     map[string]*Override
	version   int64
	expiry    time.Time // the earliest Expires, zero when none
}

// Overrides returns the overrides in force, sorted by tree, tier and value.
func (s *Snapshot) Overrides() []*Override { return s.overrides }

// Override returns the override of value of tree/tier, or nil.
func (s *Snapshot) Override(tree, tier, value string) *Override {
	return s.byKey[overrideField(tree, tier, value)]
}

// Modes returns the runtime modes, sorted by tree.
func (s *Snapshot) Modes() []*Mode { return s.modes }

// Mode returns the runtime mode of tree, or nil.
func (s *Snapshot) Mode(tree string) *Mode {
	for _, m := range s.modes {
		if m.Tree == tree {
			return m
		}
	}
	return nil
}

// Version is the backend's version the snapshot was read at.
func (s *Snapshot) Version() int64 { return s.version }

// Fields of the backend: "o" and the JSON array [tree, tier, value] for an
// override (any bytes in a value stay unambiguous), "m" and the tree for a
// mode.
func overrideField(tree, tier, value string) string {
	b, _ := json.Marshal([3]string{tree, tier, value})
	return "o" + string(b)
}

func modeField(tree string) string { return "m" + tree }

// build makes a snapshot of the backend's fields, as of now: expired
// overrides and entries that do not decode are left out.
func build(version int64, fields map[string][]byte, now time.Time, logger *zap.Logger) *Snapshot {
	s := &Snapshot{version: version, byKey: map[string]*Override{}}
	for f, raw := range fields {
		switch {
		case strings.HasPrefix(f, "o"):
			var o Override
			if err := json.Unmarshal(raw, &o); err != nil {
				logger.Warn("rate limit override unreadable, ignored", zap.String("field", f), zap.Error(err))
				continue
			}
			if !o.Expires.IsZero() && !o.Expires.After(now) {
				continue
			}
			if !o.Expires.IsZero() && (s.expiry.IsZero() || o.Expires.Before(s.expiry)) {
				s.expiry = o.Expires
			}
			s.overrides = append(s.overrides, &o)
			s.byKey[f] = &o
		case strings.HasPrefix(f, "m"):
			var m Mode
			if err := json.Unmarshal(raw, &m); err != nil {
				logger.Warn("rate limit mode unreadable, ignored", zap.String("field", f), zap.Error(err))
				continue
			}
			s.modes = append(s.modes, &m)
		}
	}
	slices.SortFunc(s.overrides, func(a, b *Override) int {
		if c := strings.Compare(a.Tree, b.Tree); c != 0 {
			return c
		}
		if c := strings.Compare(a.Tier, b.Tier); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	slices.SortFunc(s.modes, func(a, b *Mode) int { return strings.Compare(a.Tree, b.Tree) })
	return s
}

// Options configure a Runtime.
type Options struct {
	// Poll is how often the Runtime checks the backend for changes made
	// by other instances, and for expired overrides. Default 250ms.
	Poll   time.Duration
	Logger *zap.Logger
	// Now is the clock, for tests; default time.Now.
	Now func() time.Time
}

// Runtime is the runtime state of one store, shared by the handlers that
// use the store.
type Runtime struct {
	backend Backend
	opts    Options
	logger  *zap.Logger
	current atomic.Pointer[Snapshot]

	mu     sync.Mutex // orders publishing, and guards subs
	subs   map[int]func(*Snapshot)
	nextID int

	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
	failedAt time.Time // when a poll's failure was last logged
}

// New returns the Runtime of a backend, loaded with its current state. A
// backend that cannot be read (Redis down) does not fail it: it starts
// empty, says so, and loads the state when the backend answers.
func New(b Backend, opts Options) (*Runtime, error) {
	if opts.Poll <= 0 {
		opts.Poll = 250 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	r := &Runtime{backend: b, opts: opts, logger: opts.Logger, subs: map[int]func(*Snapshot){},
		stop: make(chan struct{}), done: make(chan struct{})}
	r.current.Store(&Snapshot{version: -1, byKey: map[string]*Override{}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.refresh(ctx, true); err != nil {
		r.logger.Warn("rate limit overrides and modes could not be loaded; they apply once the store answers", zap.Error(err))
	}
	go r.poll()
	return r, nil
}

// Snapshot returns the current state; never nil.
func (r *Runtime) Snapshot() *Snapshot { return r.current.Load() }

// Subscribe calls fn with every new snapshot (not the current one: read
// Snapshot for that) until cancel is called. Calls to one subscriber never
// overlap, and come in the order of the snapshots.
func (r *Runtime) Subscribe(fn func(*Snapshot)) (cancel func()) {
	r.mu.Lock()
	id := r.nextID
	r.nextID++
	r.subs[id] = fn
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.subs, id)
		r.mu.Unlock()
	}
}

// refresh reloads the state when the backend's version moved (or always,
// when forced) or an override expired, and publishes it.
func (r *Runtime) refresh(ctx context.Context, force bool) error {
	cur := r.Snapshot()
	now := r.opts.Now()
	expired := !cur.expiry.IsZero() && !cur.expiry.After(now)
	if !force && !expired {
		v, err := r.backend.Version(ctx)
		if err != nil {
			return err
		}
		if v == cur.version {
			return nil
		}
	}
	version, fields, err := r.backend.Load(ctx)
	if err != nil {
		return err
	}
	r.publish(build(version, fields, now, r.logger), force)
	if expired {
		r.prune(ctx, fields, now)
	}
	return nil
}

// publish makes s current, unless a newer version is, and calls the
// subscribers.
func (r *Runtime) publish(s *Snapshot, force bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.Snapshot()
	if s.version < cur.version && !force {
		return
	}
	r.current.Store(s)
	// Only a change is news: a new version, or an expiry (which drops
	// overrides without one).
	if s.version == cur.version && len(s.overrides) == len(cur.overrides) {
		return
	}
	if cur.version >= 0 {
		r.logger.Debug("rate limit runtime state loaded", zap.Int64("version", s.version),
			zap.Int("overrides", len(s.overrides)), zap.Int("modes", len(s.modes)))
	}
	for _, fn := range r.subs {
		fn(s)
	}
}

// prune deletes the expired overrides of fields from the backend, each
// only if it still holds what expired.
func (r *Runtime) prune(ctx context.Context, fields map[string][]byte, now time.Time) {
	for f, raw := range fields {
		if !strings.HasPrefix(f, "o") {
			continue
		}
		var o Override
		if json.Unmarshal(raw, &o) != nil || o.Expires.IsZero() || o.Expires.After(now) {
			continue
		}
		if _, err := r.backend.Change(ctx, f, opPrune, raw); err != nil {
			return // another instance, or the next poll, prunes it
		}
		r.logger.Info("rate limit override expired", zap.String("tree", o.Tree), zap.String("tier", o.Tier),
			zap.String("value", clip(o.Value)), zap.Time("expires", o.Expires), zap.String("note", o.Note))
	}
}

func (r *Runtime) poll() {
	defer close(r.done)
	t := time.NewTicker(r.opts.Poll)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := r.refresh(ctx, false)
		cancel()
		if err != nil && time.Since(r.failedAt) > 10*time.Second {
			r.failedAt = time.Now()
			r.logger.Warn("rate limit runtime state: the store did not answer; the last state stays in force", zap.Error(err))
		}
	}
}

// Close stops polling. It is safe to call more than once.
func (r *Runtime) Close() error {
	r.closed.Do(func() { close(r.stop) })
	<-r.done
	return nil
}

func clip(s string) string {
	if len(s) > 256 {
		return s[:256] + "…"
	}
	return s
}

// write applies one change to the backend and publishes the new state at
// once, so that this instance applies it before the call returns.
func (r *Runtime) write(ctx context.Context, field string, op op, value []byte) ([]byte, error) {
	old, err := r.backend.Change(ctx, field, op, value)
	if err != nil {
		return nil, fmt.Errorf("writing the runtime state: %w", err)
	}
	if err := r.refresh(ctx, true); err != nil {
		return old, fmt.Errorf("reading the runtime state back: %w", err)
	}
	return old, nil
}

// SetOverride sets (or replaces) an override, and returns the one it
// replaced, if any.
func (r *Runtime) SetOverride(ctx context.Context, o *Override) (old *Override, err error) {
	switch {
	case o.Tree == "" || o.Tier == "":
		return nil, invalid("an override names its tree and tier")
	case len(o.Value) > maxValue:
		return nil, invalid("the value is %d bytes: at most %d", len(o.Value), maxValue)
	case len(o.Note) > maxNote:
		return nil, invalid("the note is %d bytes: keep it under %d", len(o.Note), maxNote)
	case o.Unlimited && len(o.Limits) > 0:
		return nil, invalid("unlimited and limits are exclusive: give one")
	case !o.Unlimited && len(o.Limits) == 0:
		return nil, invalid("no limits: give limits, or unlimited")
	case !o.Expires.IsZero() && !o.Expires.After(r.opts.Now()):
		return nil, invalid("expires %s is in the past: give a future RFC 3339 time, or leave it out", o.Expires.Format(time.RFC3339))
	}
	for _, l := range o.Limits {
		if l == nil {
			return nil, invalid("a limit is null")
		}
		if err := l.Validate(); err != nil {
			return nil, invalid("limit %s: %v", l.String(), err)
		}
	}
	c := *o
	c.Updated = r.opts.Now().UTC()
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	prev, err := r.write(ctx, overrideField(o.Tree, o.Tier, o.Value), opSet, raw)
	old = decodeOld[Override](prev)
	if err == nil || prev != nil {
		r.logger.Info("rate limit override set", zap.String("tree", o.Tree), zap.String("tier", o.Tier),
			zap.String("value", clip(o.Value)), zap.Any("old", old), zap.Any("new", &c), zap.String("note", o.Note))
	}
	return old, err
}

// DeleteOverride deletes an override and returns it (nil when there was
// none).
func (r *Runtime) DeleteOverride(ctx context.Context, tree, tier, value string) (old *Override, err error) {
	prev, err := r.write(ctx, overrideField(tree, tier, value), opDelete, nil)
	old = decodeOld[Override](prev)
	if old != nil {
		r.logger.Info("rate limit override deleted", zap.String("tree", tree), zap.String("tier", tier),
			zap.String("value", clip(value)), zap.Any("old", old), zap.String("note", old.Note))
	}
	return old, err
}

// SetMode sets a tree's runtime mode and returns the one it replaced.
func (r *Runtime) SetMode(ctx context.Context, m *Mode) (old *Mode, err error) {
	switch m.Mode {
	case "enforce", "warn", "shadow":
	default:
		return nil, invalid("mode %q: use enforce, warn or shadow", m.Mode)
	}
	if m.Tree == "" {
		return nil, invalid("a mode names its tree")
	}
	if len(m.Note) > maxNote {
		return nil, invalid("the note is %d bytes: keep it under %d", len(m.Note), maxNote)
	}
	c := *m
	c.Updated = r.opts.Now().UTC()
	raw, _ := json.Marshal(&c)
	prev, err := r.write(ctx, modeField(m.Tree), opSet, raw)
	old = decodeOld[Mode](prev)
	r.logger.Info("rate limit mode set", zap.String("tree", m.Tree), zap.Any("old", old), zap.Any("new", &c), zap.String("note", m.Note))
	return old, err
}

// DeleteMode returns a tree to its configured mode, and returns the
// runtime mode it had (nil when none).
func (r *Runtime) DeleteMode(ctx context.Context, tree string) (old *Mode, err error) {
	prev, err := r.write(ctx, modeField(tree), opDelete, nil)
	old = decodeOld[Mode](prev)
	if old != nil {
		r.logger.Info("rate limit mode deleted", zap.String("tree", tree), zap.Any("old", old))
	}
	return old, err
}

func decodeOld[T any](raw []byte) *T {
	if raw == nil {
		return nil
	}
	var v T
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	return &v
}

// NewSnapshot returns a snapshot of the given overrides and modes, as a
// Runtime would publish it (expired overrides left out): for tests and
// tools that install state without a backend.
func NewSnapshot(overrides []*Override, modes []*Mode, now time.Time) *Snapshot {
	fields := map[string][]byte{}
	for _, o := range overrides {
		raw, _ := json.Marshal(o)
		fields[overrideField(o.Tree, o.Tier, o.Value)] = raw
	}
	for _, m := range modes {
		raw, _ := json.Marshal(m)
		fields[modeField(m.Tree)] = raw
	}
	return build(0, fields, now, zap.NewNop())
}
