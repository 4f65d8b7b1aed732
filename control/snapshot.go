package control

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// Snapshot is the runtime state at one moment: the overrides and
// entitlements in force, and the modes. It is immutable once published,
// and shared: callers must not modify it, nor the overrides, modes,
// entitlements and limits it returns.
//
// A nil *Snapshot is the empty state.
type Snapshot struct {
	overrides []*Override // sorted by tree, tier, value
	modes     []*Mode     // sorted by tree
	byKey     map[overrideKey]*Override
	byTree    map[string]*Mode
	// entitlements are sorted by name, value.
	entitlements  []*Entitlement
	byEntitlement map[entitlementKey]*Entitlement
	version       int64
	// expiry is the earliest Expires of the overrides and entitlements,
	// zero when none expires: when the snapshot stops being true.
	expiry time.Time
}

// expires records that an entry of the snapshot ends at t (zero: never).
func (s *Snapshot) expires(t time.Time) {
	if !t.IsZero() && (s.expiry.IsZero() || t.Before(s.expiry)) {
		s.expiry = t
	}
}

type overrideKey struct{ tree, tier, value string }

// Overrides returns the overrides in force, sorted by tree, tier and
// value. An override past its expiry is never among them.
func (s *Snapshot) Overrides() []*Override {
	if s == nil {
		return nil
	}
	return s.overrides
}

// Override returns the override of value for tier of tree, or nil when
// there is none.
func (s *Snapshot) Override(tree, tier, value string) *Override {
	if s == nil {
		return nil
	}
	return s.byKey[overrideKey{tree, tier, value}]
}

// Modes returns the modes set at runtime, sorted by tree.
func (s *Snapshot) Modes() []*Mode {
	if s == nil {
		return nil
	}
	return s.modes
}

// Mode returns the mode set at runtime for tree, or nil when there is
// none (the tree runs in its configured mode).
func (s *Snapshot) Mode(tree string) *Mode {
	if s == nil {
		return nil
	}
	return s.byTree[tree]
}

// Version is the backend's version the snapshot was read at: it grows
// with every change, and is -1 until the backend was first read. Two
// snapshots of one version may differ when an override or entitlement
// expired between them.
func (s *Snapshot) Version() int64 {
	if s == nil {
		return -1
	}
	return s.version
}

// built is a snapshot and what building it found.
type built struct {
	snap *Snapshot
	// live are the fields the snapshot holds: two states are the same
	// when their live fields are.
	live map[string][]byte
	// expired are the fields of expired overrides and entitlements, to
	// prune.
	expired []string
	// rejected are the fields that are not valid, each with what was done
	// instead and why.
	rejected map[string]rejection
}

// rejection is what build did with a field that is not valid.
type rejection struct {
	// enforced: a mode that is not valid, which counts as enforce;
	// otherwise the entry is left out.
	enforced bool
	err      error
}

// build makes the snapshot of a backend's fields at version, as of now:
// expired overrides and entitlements are left out, and so are fields
// whose name is of another format (written by a newer Cascade).
//
// The fields come from a store that others may write to, so each is
// validated as the admin call that writes it would be: an override that
// does not decode or is not valid is left out (the configured limits
// apply to its value), and so is such an entitlement (the source
// answers); a mode that is not valid counts as enforce, so that a stray
// or hostile write never turns enforcement off.
func build(version int64, fields map[string][]byte, now time.Time) built {
	s := &Snapshot{version: version, byKey: map[overrideKey]*Override{}, byTree: map[string]*Mode{},
		byEntitlement: map[entitlementKey]*Entitlement{}}
	b := built{snap: s, live: make(map[string][]byte, len(fields))}
	reject := func(f string, enforced bool, err error) {
		if b.rejected == nil {
			b.rejected = map[string]rejection{}
		}
		b.rejected[f] = rejection{enforced, err}
	}
	for f, raw := range fields {
		switch {
		case strings.HasPrefix(f, overridePrefix):
			o, err := readOverride(f, raw)
			if err != nil {
				reject(f, false, err)
				continue
			}
			if !o.Expires.IsZero() && !o.Expires.After(now) {
				b.expired = append(b.expired, f)
				continue
			}
			if err := o.check(now); err != nil {
				reject(f, false, err)
				continue
			}
			s.expires(o.Expires)
			s.overrides = append(s.overrides, o)
			s.byKey[overrideKey{o.Tree, o.Tier, o.Value}] = o
			b.live[f] = raw
		case strings.HasPrefix(f, modePrefix):
			tree := f[len(modePrefix):]
			if err := checkName("tree", tree); err != nil {
				reject(f, false, err) // names no tree: nothing to enforce
				continue
			}
			m, err := readMode(tree, raw)
			if err != nil {
				reject(f, true, err)
				m = &Mode{Tree: tree, Mode: ModeEnforce, Updated: m.Updated}
			}
			s.modes = append(s.modes, m)
			s.byTree[m.Tree] = m
			b.live[f] = raw
		case strings.HasPrefix(f, entitlementPrefix):
			e, err := readEntitlement(f, raw)
			if err != nil {
				reject(f, false, err)
				continue
			}
			if !e.Expires.IsZero() && !e.Expires.After(now) {
				b.expired = append(b.expired, f)
				continue
			}
			if err := e.check(now); err != nil {
				reject(f, false, err)
				continue
			}
			s.expires(e.Expires)
			s.entitlements = append(s.entitlements, e)
			s.byEntitlement[entitlementKey{e.Name, e.Value}] = e
			b.live[f] = raw
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
	slices.SortFunc(s.entitlements, func(a, b *Entitlement) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	slices.Sort(b.expired)
	return b
}

// NewSnapshot returns the snapshot a Runtime would publish at now for the
// given overrides and modes (expired overrides left out; of several
// entries for one override or mode, the last), at version 0. It is for
// tests and tools that install a state without a backend. It validates
// as a Runtime does: an override that is not valid is left out, a mode
// that is not valid counts as enforce.
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
	return build(0, fields, now).snap
}

// readOverride decodes an override's field and document; the field says
// its tree, tier and value.
func readOverride(f string, raw []byte) (*Override, error) {
	tree, tier, value, ok := parseOverrideField(f)
	if !ok {
		return nil, invalid("the field is not tree, tier and value separated by NUL bytes")
	}
	if len(raw) > maxEntry {
		return nil, invalid("the entry is %d bytes long: at most %d", len(raw), maxEntry)
	}
	o := new(Override)
	if err := json.Unmarshal(raw, o); err != nil {
		return nil, invalid("the entry is not an override's JSON: %v", err)
	}
	o.Tree, o.Tier, o.Value = tree, tier, value
	return o, nil
}

// readMode decodes and validates a mode's document. On error it still
// returns a Mode, with what could be read of it.
func readMode(tree string, raw []byte) (*Mode, error) {
	m := &Mode{Tree: tree}
	if len(raw) > maxEntry {
		return m, invalid("the entry is %d bytes long: at most %d", len(raw), maxEntry)
	}
	if err := json.Unmarshal(raw, m); err != nil {
		return &Mode{Tree: tree}, invalid("the entry is not a mode's JSON: %v", err)
	}
	m.Tree = tree
	return m, checkMode(m)
}
