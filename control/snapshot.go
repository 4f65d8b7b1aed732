package control

import (
	"encoding/json"
	"slices"
	"strings"
	"time"
)

// Snapshot is the runtime state at one moment: the overrides in force and
// the modes. It is immutable once published, and shared: callers must not
// modify it, nor the overrides, modes and limits it returns.
//
// A nil *Snapshot is the empty state.
type Snapshot struct {
	overrides []*Override // sorted by tree, tier, value
	modes     []*Mode     // sorted by tree
	byKey     map[overrideKey]*Override
	byTree    map[string]*Mode
	version   int64
	// expiry is the earliest Expires of the overrides, zero when none
	// expires: when the snapshot stops being true.
	expiry time.Time
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
// snapshots of one version may differ when an override expired between
// them.
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
	// expired are the fields of expired overrides, to prune.
	expired []string
	// unreadable are fields that did not decode, with their error.
	unreadable map[string]error
}

// build makes the snapshot of a backend's fields at version, as of now:
// expired overrides are left out, and so are fields that do not decode or
// whose name is of another format (written by a newer Cascade).
func build(version int64, fields map[string][]byte, now time.Time) built {
	s := &Snapshot{version: version, byKey: map[overrideKey]*Override{}, byTree: map[string]*Mode{}}
	b := built{snap: s, live: make(map[string][]byte, len(fields))}
	bad := func(f string, err error) {
		if b.unreadable == nil {
			b.unreadable = map[string]error{}
		}
		b.unreadable[f] = err
	}
	for f, raw := range fields {
		switch {
		case strings.HasPrefix(f, overridePrefix):
			tree, tier, value, ok := parseOverrideField(f)
			if !ok {
				continue
			}
			o := new(Override)
			if err := json.Unmarshal(raw, o); err != nil {
				bad(f, err)
				continue
			}
			o.Tree, o.Tier, o.Value = tree, tier, value
			if !o.Expires.IsZero() {
				if !o.Expires.After(now) {
					b.expired = append(b.expired, f)
					continue
				}
				if s.expiry.IsZero() || o.Expires.Before(s.expiry) {
					s.expiry = o.Expires
				}
			}
			s.overrides = append(s.overrides, o)
			s.byKey[overrideKey{tree, tier, value}] = o
			b.live[f] = raw
		case strings.HasPrefix(f, modePrefix):
			m := new(Mode)
			if err := json.Unmarshal(raw, m); err != nil {
				bad(f, err)
				continue
			}
			m.Tree = f[len(modePrefix):]
			s.modes = append(s.modes, m)
			s.byTree[m.Tree] = m
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
	slices.Sort(b.expired)
	return b
}

// NewSnapshot returns the snapshot a Runtime would publish at now for the
// given overrides and modes (expired overrides left out; of several
// entries for one override or mode, the last), at version 0. It is for
// tests and tools that install a state without a backend; it does not
// validate.
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
