package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// DefaultPoll is how often a Runtime polls its backend unless
// Options.Poll says otherwise.
const DefaultPoll = 250 * time.Millisecond

const (
	// ioTimeout bounds one call to the backend made by the Runtime itself
	// (start, poll, read back, prune).
	ioTimeout = 2 * time.Second
	// warnEvery is how often, at most, a failing poll is logged.
	warnEvery = 10 * time.Second
	// prunePerPoll bounds the deletions of expired entries per poll.
	prunePerPoll = 100
)

// Options configure a Runtime. The zero value is ready to use.
type Options struct {
	// Poll is how often the Runtime checks its backend for changes made
	// by other instances (one GET in Redis) and its snapshot for expired
	// overrides. Default DefaultPoll (250ms). It bounds how long another
	// instance's change, or an expiry, takes to apply.
	Poll time.Duration
	// Logger receives the changes this instance makes (INFO), the changes
	// it picks up from others (DEBUG) and backend failures (WARN, at most
	// once per 10s). Default: no logging.
	Logger *zap.Logger
	// Now is the clock that expires overrides and stamps changes, for
	// tests. Default time.Now.
	Now func() time.Time
}

// Runtime is the runtime state of one store, shared by every handler that
// uses the store; a handler reads it through Snapshot or Subscribe. It is
// safe for concurrent use. Create one with New and Close it when the store
// goes away.
type Runtime struct {
	backend Backend
	poll    time.Duration
	logger  *zap.Logger
	now     func() time.Time

	current atomic.Pointer[Snapshot]

	// mu orders reading the backend and publishing: a snapshot is read
	// and published under it, so snapshots are published in the order
	// they were read, and subscribers are called under it, one snapshot
	// at a time.
	mu sync.Mutex
	// version and fields are the backend's as last read (version -1:
	// never read, or unknown after a write that could not be read back).
	version int64
	fields  map[string][]byte
	live    map[string][]byte // the fields in the current snapshot
	expired []string          // fields of expired overrides not yet pruned
	// rejected are the fields found not valid at the last install, as
	// they were: each is logged when it appears or changes, not at every
	// install.
	rejected map[string][]byte
	// badVersion is the version key's value last found not valid and
	// not repaired: logged once, not at every poll.
	badVersion string

	subsMu sync.Mutex // guards subs and shows; never held while calling one
	subs   map[uint64]func(*Snapshot)
	shows  map[uint64]ValueShower
	nextID uint64

	// failing and warned belong to the poll goroutine (and to New
	// before it starts).
	failing bool
	warned  time.Time

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New returns the Runtime of backend, loaded with its current state, and
// starts polling it. A backend that cannot be read (Redis down) does not
// fail New: the Runtime starts empty, logs a warning, and loads the state
// as soon as a poll succeeds. New fails only when backend is nil.
func New(backend Backend, opts Options) (*Runtime, error) {
	if backend == nil {
		return nil, errors.New("control: no backend")
	}
	r := &Runtime{
		backend: backend,
		poll:    opts.Poll,
		logger:  opts.Logger,
		now:     opts.Now,
		version: -1,
		live:    map[string][]byte{},
		subs:    map[uint64]func(*Snapshot){},
		shows:   map[uint64]ValueShower{},
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	if r.poll <= 0 {
		r.poll = DefaultPoll
	}
	if r.logger == nil {
		r.logger = zap.NewNop()
	}
	if r.now == nil {
		r.now = time.Now
	}
	r.current.Store(build(-1, nil, r.now()).snap)

	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	r.mu.Lock()
	err := r.loadLocked(ctx)
	r.mu.Unlock()
	cancel()
	if err != nil {
		r.failing, r.warned = true, r.now()
		r.logger.Warn("rate limit overrides and modes could not be loaded from the store: starting without them; they apply as soon as the store answers",
			zap.Error(err))
	}
	go r.run()
	return r, nil
}

// Snapshot returns the current state: one atomic load, never nil.
func (r *Runtime) Snapshot() *Snapshot { return r.current.Load() }

// Subscribe calls fn with the current snapshot, before it returns, and
// then with every new one until cancel is called: after each change made
// through this Runtime (in the writer's goroutine, before the write
// returns), each change made by another instance and picked up by a poll,
// and each expiry (in the Runtime's goroutine).
//
// Calls to all subscribers are serialized and come in the order of the
// snapshots, so fn never runs concurrently with itself and never sees an
// older state after a newer one; calling fn with the current snapshot
// under the same order means none is missed between subscribing and
// reading. fn should be quick (it delays other subscribers and writes),
// may read the Runtime and cancel subscriptions, but must not write
// through it (SetOverride, ...) nor Subscribe: that deadlocks.
//
// cancel may be called more than once, and from fn; once it returned, fn
// is not called again, unless a call was already under way.
func (r *Runtime) Subscribe(fn func(*Snapshot)) (cancel func()) {
	r.mu.Lock()
	r.subsMu.Lock()
	id := r.nextID
	r.nextID++
	r.subs[id] = fn
	r.subsMu.Unlock()
	fn(r.Snapshot())
	r.mu.Unlock()
	return func() {
		r.subsMu.Lock()
		delete(r.subs, id)
		r.subsMu.Unlock()
	}
}

// ValueShower is how a handler shows a value of one of its trees' tiers
// in a log (a credential as a fingerprint, see engine.Engine.Show): the
// value as shown, and whether it knows tree.
type ValueShower func(tree, tier, value string) (shown string, known bool)

// ShowValues registers show for the Runtime's logs, until cancel is
// called. Every log line of the Runtime that names a tier's value asks
// every registered shower: a value that any handler knowing its tree
// shows otherwise than as it is (a fingerprint) is written that way, so
// that two handlers naming a tree alike never show one's secret raw; a
// value of a tree none of them knows is not written at all, since the
// Runtime cannot tell whether it is a secret.
func (r *Runtime) ShowValues(show ValueShower) (cancel func()) {
	r.subsMu.Lock()
	id := r.nextID
	r.nextID++
	r.shows[id] = show
	r.subsMu.Unlock()
	return func() {
		r.subsMu.Lock()
		delete(r.shows, id)
		r.subsMu.Unlock()
	}
}

// shown is value as a log may show it (see ShowValues), clipped.
func (r *Runtime) shown(tree, tier, value string) string {
	r.subsMu.Lock()
	shows := slices.Collect(maps.Values(r.shows))
	r.subsMu.Unlock()
	known := false
	for _, show := range shows {
		if s, ok := show(tree, tier, value); ok {
			if s != value {
				return clip(s)
			}
			known = true
		}
	}
	if known {
		return clip(value)
	}
	return "(not shown: no handler has tree " + clip(tree) + ")"
}

// Close stops polling. The last snapshot stays readable, and writes still
// reach the backend (and publish), but changes by other instances and
// expiries are no longer picked up. Close is idempotent and always
// returns nil.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() { close(r.stop) })
	<-r.done
	return nil
}

// loadLocked reads the whole state and publishes it. The caller holds
// r.mu.
//
// A version that is not valid (written by something other than Cascade)
// must not keep the state from loading, nor every later change from
// being stored (control.lua's INCR fails on it): the version is reset to
// a fresh one, which makes every instance reload, and the state is read
// again. When it cannot be reset (the store refuses the write), the
// fields read are installed at version -1, and every poll reloads them
// until it can.
func (r *Runtime) loadLocked(ctx context.Context) error {
	version, fields, err := r.backend.Load(ctx)
	var bad *BadVersionError
	if errors.As(err, &bad) {
		if _, rerr := r.repairVersion(ctx, bad); rerr == nil {
			version, fields, err = r.backend.Load(ctx)
		}
		if errors.As(err, &bad) {
			version, err = -1, nil
		}
	}
	if err != nil {
		return err
	}
	r.installLocked(version, fields)
	return nil
}

// repairVersion resets a version found not valid, when the backend can,
// and logs it: the reset once, a failure once per bad value.
func (r *Runtime) repairVersion(ctx context.Context, bad *BadVersionError) (int64, error) {
	rep, ok := r.backend.(versionRepairer)
	if !ok {
		return 0, bad
	}
	v, err := rep.RepairVersion(ctx)
	if err != nil {
		if r.badVersion != bad.Value {
			r.badVersion = bad.Value
			r.logger.Warn("rate limit runtime state: the store's version is not valid and could not be reset; the state is reloaded at every poll until it can be (give the store's user SET on the key)",
				zap.String("key", bad.Key), zap.String("value", bad.Value), zap.Error(err))
		}
		return 0, err
	}
	r.badVersion = ""
	r.logger.Warn("rate limit runtime state: the store's version was not valid (not written by Cascade); reset it, every instance reloads the state",
		zap.String("key", bad.Key), zap.String("value", bad.Value), zap.Int64("version", v))
	return v, nil
}

// installLocked publishes the state of fields at version, as of now, and
// calls the subscribers if it differs from the current one. The caller
// holds r.mu.
func (r *Runtime) installLocked(version int64, fields map[string][]byte) (changed bool) {
	b := build(version, fields, r.now())
	rejected := make(map[string][]byte, len(b.rejected))
	for f, rej := range b.rejected {
		rejected[f] = fields[f]
		if seen, ok := r.rejected[f]; ok && bytes.Equal(seen, fields[f]) {
			continue
		}
		msg := "rate limit runtime state: an entry in the store is not valid and is ignored (the configured limits apply); delete it, or set it again through the admin API"
		if rej.enforced {
			msg = "rate limit runtime state: a mode in the store is not valid; the tree is enforced; delete it, or set it again through the admin API"
		}
		if tree, tier, value, ok := parseOverrideField(f); ok {
			r.logger.Warn(msg, zap.String("tree", tree), zap.String("tier", tier), zap.String("value", r.shown(tree, tier, value)), zap.Error(rej.err))
		} else if name, value, ok := parseEntitlementField(f); ok {
			msg = "rate limit runtime state: an entitlement in the store is not valid and is ignored (the entitlements source answers); delete it, or set it again through the admin API"
			r.logger.Warn(msg, zap.String("entitlements", clip(name)), valueNotShown(value), zap.Error(rej.err))
		} else {
			r.logger.Warn(msg, zap.Int("field_bytes", len(f)), zap.Error(rej.err))
		}
	}
	changed = !maps.EqualFunc(r.live, b.live, bytes.Equal)
	r.version, r.fields, r.live, r.expired, r.rejected = version, fields, b.live, b.expired, rejected
	r.current.Store(b.snap)
	if changed {
		r.subsMu.Lock()
		subs := make([]func(*Snapshot), 0, len(r.subs))
		for _, fn := range r.subs {
			subs = append(subs, fn)
		}
		r.subsMu.Unlock()
		for _, fn := range subs {
			fn(b.snap)
		}
	}
	return changed
}

// run polls until Close.
func (r *Runtime) run() {
	defer close(r.done)
	t := time.NewTicker(r.poll)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
			r.tick()
		}
	}
}

// tick is one poll: expire what expired, reload when the version moved,
// prune expired entries from the backend.
func (r *Runtime) tick() {
	ctx, cancel := context.WithTimeout(context.Background(), ioTimeout)
	defer cancel()

	// Expiry first, by the clock alone: it must not wait on a backend
	// that hangs.
	r.mu.Lock()
	if exp := r.Snapshot().expiry; !exp.IsZero() && !r.now().Before(exp) {
		before := len(r.live)
		r.installLocked(r.version, r.fields)
		r.logger.Debug("rate limit overrides or entitlements expired", zap.Int("expired", before-len(r.live)))
	}
	r.mu.Unlock()

	v, err := r.backend.Version(ctx)
	var prune []string
	var fields map[string][]byte
	r.mu.Lock()
	var bad *BadVersionError
	if errors.As(err, &bad) {
		// Repaired: a fresh version, which differs from r.version. Not
		// repaired: reload regardless (-2 is never r.version).
		if v, err = r.repairVersion(ctx, bad); err != nil {
			v, err = -2, nil
		}
	}
	if err == nil && v != r.version {
		if err = r.loadLocked(ctx); err == nil {
			s := r.Snapshot()
			r.logger.Debug("rate limit runtime state changed in the store; applied",
				zap.Int64("version", s.version), zap.Int("overrides", len(s.overrides)), zap.Int("modes", len(s.modes)),
				zap.Int("entitlements", len(s.entitlements)))
		}
	}
	if err == nil {
		prune, fields = r.expired, r.fields
		if len(prune) > prunePerPoll {
			prune = prune[:prunePerPoll]
		}
	}
	r.mu.Unlock()
	r.health(err)

	for _, f := range prune {
		deleted, err := r.backend.DeleteIf(ctx, f, fields[f])
		if err != nil {
			return // the next poll tries again
		}
		if !deleted {
			continue
		}
		if tree, tier, value, ok := parseOverrideField(f); ok {
			if o := decode[Override](fields[f]); o != nil {
				r.logger.Info("rate limit override expired and removed from the store",
					zap.String("tree", tree), zap.String("tier", tier), zap.String("value", r.shown(tree, tier, value)),
					zap.Object("old", overrideLog{o}), zap.String("note", o.Note))
			}
		} else if name, value, ok := parseEntitlementField(f); ok {
			if e := decode[Entitlement](fields[f]); e != nil {
				r.logger.Info("rate limit entitlement expired and removed from the store",
					zap.String("entitlements", name), valueNotShown(value),
					zap.Object("old", entitlementLog{e}), zap.String("note", e.Note))
			}
		}
	}
}

// health logs a poll's failure, at most once per warnEvery, and the
// recovery after one.
func (r *Runtime) health(err error) {
	now := r.now()
	switch {
	case err == nil:
		if r.failing {
			r.failing = false
			r.logger.Info("rate limit runtime state: the store answers again")
		}
	case !r.failing || now.Sub(r.warned) >= warnEvery:
		r.failing, r.warned = true, now
		r.logger.Warn("rate limit runtime state: the store does not answer; the last overrides and modes stay in force",
			zap.Error(err))
	}
}

// write makes one change in the backend and, when it changed something,
// publishes the new state before returning, so that this instance
// applies it at once. change returns the field's old value.
func (r *Runtime) write(ctx context.Context, doing string, field string, value []byte, change func(ctx context.Context) ([]byte, error)) ([]byte, error) {
	old, err := change(ctx)
	if bad := (*BadVersionError)(nil); errors.As(err, &bad) {
		// The change's version increment failed on a version that is not
		// valid: once repaired — here, or meanwhile by another instance's
		// poll — the change is made again, as it would have been.
		r.repairIfBad(ctx)
		old, err = change(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("control: %s: the store failed: %w", doing, err)
	}
	if value == nil && old == nil {
		return nil, nil // deleted nothing: nothing changed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.loadLocked(ctx); err != nil {
		// The change is stored but the state could not be read back:
		// apply it to the last state read, and mark the version unknown
		// so that the next poll reloads it.
		fields := maps.Clone(r.fields)
		if fields == nil {
			fields = map[string][]byte{}
		}
		if value != nil {
			fields[field] = value
		} else {
			delete(fields, field)
		}
		r.installLocked(-1, fields)
		r.logger.Warn("rate limit runtime state: a change was stored but could not be read back; applied locally, the next poll reloads it",
			zap.Error(err))
	}
	return old, nil
}

// repairIfBad repairs the backend's version if it is (still) not valid:
// after a write whose version increment failed on it.
func (r *Runtime) repairIfBad(ctx context.Context) {
	var bad *BadVersionError
	if _, err := r.backend.Version(ctx); !errors.As(err, &bad) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = r.repairVersion(ctx, bad) // logged; the change is tried again either way
}

// SetOverride sets the override of o.Value for o.Tier of o.Tree, replacing
// any, and returns the one it replaced (nil when none). It validates o
// (an *InvalidError says what to fix), stamps the stored copy's Updated,
// and returns once this instance applies it; others do within Poll. o is
// not modified nor kept.
func (r *Runtime) SetOverride(ctx context.Context, o *Override) (old *Override, err error) {
	if o == nil {
		return nil, invalid("no override given")
	}
	if err := o.check(r.now()); err != nil {
		return nil, err
	}
	c := *o
	c.Updated = r.now().UTC()
	if !c.Expires.IsZero() {
		c.Expires = c.Expires.UTC()
	}
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("control: encoding the override: %w", err)
	}
	field := overrideField(c.Tree, c.Tier, c.Value)
	prev, err := r.write(ctx, "setting the override", field, raw, func(ctx context.Context) ([]byte, error) {
		return r.backend.Set(ctx, field, raw)
	})
	if err != nil {
		return nil, err
	}
	old = oldOverride(prev, c.Tree, c.Tier, c.Value)
	r.logger.Info("rate limit override set",
		zap.String("tree", c.Tree), zap.String("tier", c.Tier), zap.String("value", r.shown(c.Tree, c.Tier, c.Value)),
		objectOrNil("old", old), zap.Object("new", overrideLog{&c}), zap.String("note", c.Note))
	return old, nil
}

// DeleteOverride deletes the override of value for tier of tree, and
// returns it (nil when there was none, which is not an error).
func (r *Runtime) DeleteOverride(ctx context.Context, tree, tier, value string) (old *Override, err error) {
	if err := checkName("tree", tree); err != nil {
		return nil, err
	}
	if err := checkName("tier", tier); err != nil {
		return nil, err
	}
	if len(value) > maxValue {
		return nil, invalid("the value is %d bytes long: at most %d", len(value), maxValue)
	}
	field := overrideField(tree, tier, value)
	prev, err := r.write(ctx, "deleting the override", field, nil, func(ctx context.Context) ([]byte, error) {
		return r.backend.Delete(ctx, field)
	})
	if err != nil || prev == nil {
		return nil, err
	}
	old = oldOverride(prev, tree, tier, value)
	note := ""
	if old != nil {
		note = old.Note
	}
	r.logger.Info("rate limit override deleted",
		zap.String("tree", tree), zap.String("tier", tier), zap.String("value", r.shown(tree, tier, value)),
		objectOrNil("old", old), zap.String("note", note))
	return old, nil
}

// SetMode sets the runtime mode of m.Tree, replacing any, and returns the
// one it replaced (nil when none). It validates m (an *InvalidError says
// what to fix) and stamps the stored copy's Updated; m is not modified
// nor kept.
func (r *Runtime) SetMode(ctx context.Context, m *Mode) (old *Mode, err error) {
	if m == nil {
		return nil, invalid("no mode given")
	}
	if err := checkMode(m); err != nil {
		return nil, err
	}
	c := *m
	c.Updated = r.now().UTC()
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("control: encoding the mode: %w", err)
	}
	field := modeField(c.Tree)
	prev, err := r.write(ctx, "setting the mode", field, raw, func(ctx context.Context) ([]byte, error) {
		return r.backend.Set(ctx, field, raw)
	})
	if err != nil {
		return nil, err
	}
	old = oldMode(prev, c.Tree)
	r.logger.Info("rate limit mode set",
		zap.String("tree", c.Tree), zap.String("old", modeOf(old)), zap.String("new", c.Mode), zap.String("note", c.Note))
	return old, nil
}

// DeleteMode returns tree to its configured mode, and returns the runtime
// mode it had (nil when none, which is not an error).
func (r *Runtime) DeleteMode(ctx context.Context, tree string) (old *Mode, err error) {
	if err := checkName("tree", tree); err != nil {
		return nil, err
	}
	field := modeField(tree)
	prev, err := r.write(ctx, "deleting the mode", field, nil, func(ctx context.Context) ([]byte, error) {
		return r.backend.Delete(ctx, field)
	})
	if err != nil || prev == nil {
		return nil, err
	}
	old = oldMode(prev, tree)
	note := ""
	if old != nil {
		note = old.Note
	}
	r.logger.Info("rate limit mode deleted",
		zap.String("tree", tree), zap.String("old", modeOf(old)), zap.String("note", note))
	return old, nil
}

// oldOverride decodes a replaced override; the field, not the JSON, says
// its tree, tier and value.
func oldOverride(raw []byte, tree, tier, value string) *Override {
	o := decode[Override](raw)
	if o != nil {
		o.Tree, o.Tier, o.Value = tree, tier, value
	}
	return o
}

func oldMode(raw []byte, tree string) *Mode {
	m := decode[Mode](raw)
	if m != nil {
		m.Tree = tree
	}
	return m
}

func modeOf(m *Mode) string {
	if m == nil {
		return ""
	}
	return m.Mode
}

func objectOrNil(key string, o *Override) zap.Field {
	if o == nil {
		return zap.Skip()
	}
	return zap.Object(key, overrideLog{o})
}
