// Package entitle looks up what a customer is entitled to (a plan, limits of
// its own, fields for placeholders) from business data keyed by a tier's
// value, such as an organisation id, and caches the answers.
//
// A Source answers one value: a File (JSON or YAML, reloaded when it
// changes), a Redis hash, or an HTTP service. A Cache in front of it is the
// only thing a request calls: it answers from memory, refreshes busy values
// in the background before they expire, serves the last good answer for a
// while when the source fails, and never makes a request wait longer than
// its Timeout.
//
// The package knows nothing of Caddy or HTTP handlers.
package entitle

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// Entitlement is what a source says of one value. A Cache hands the same
// Entitlement to every caller: treat it, its Limits and its Fields as
// read-only.
type Entitlement struct {
	// Plan is the plan's name; "" when the source names none.
	Plan string
	// Limits are the value's own limits, uncompiled (the caller compiles
	// them into its tree); nil when it has none.
	Limits []*hierarchy.Limit
	// Fields are the value's top-level fields whose values are a string, a
	// number or a bool, as text (numbers as written), for placeholders. The
	// plan is one of them; the limits are not.
	Fields map[string]string
	// Source names where it comes from: a Cache's Options.Name, set on
	// every answer the cache keeps (so that an answer alone says whose it
	// is, for placeholders).
	Source string
}

// Memo keeps what a caller derives from an answer of a Cache (the plan's
// index in a tree and its own limits compiled there), for as long as the
// cache keeps the answer: the request path reads it rather than deriving it
// again. It lies in the answer's first cache line, beside what a Get reads,
// and is written once: the first Set stays.
type Memo struct {
	state atomic.Uint32 // memoEmpty, memoSetting, memoSet
	index int32         // the plan's index in owner (hierarchy.Entitlement.Index)
	owner *hierarchy.Tree
	own   *hierarchy.Entitlement // its Tier and Own when the value has limits of its own, else nil
}

// A Memo's states.
const (
	memoEmpty uint32 = iota
	memoSetting
	memoSet
)

// Entitled sets ent to what owner set (indexed: its Plan is not kept),
// and reports false, leaving ent as it is, when nothing was set or another
// owner set it.
func (m *Memo) Entitled(owner *hierarchy.Tree, ent *hierarchy.Entitlement) bool {
	if m.state.Load() != memoSet || m.owner != owner {
		return false
	}
	ent.Indexed, ent.Index = true, int(m.index)
	if m.own != nil {
		ent.Tier, ent.Own = m.own.Tier, m.own.Own
	}
	return true
}

// SetEntitled keeps ent, indexed, for owner, unless something was set
// already (or is being set: that one stays).
func (m *Memo) SetEntitled(owner *hierarchy.Tree, ent hierarchy.Entitlement) {
	if !ent.Indexed || ent.Index != int(int32(ent.Index)) || !m.state.CompareAndSwap(memoEmpty, memoSetting) {
		return
	}
	m.owner, m.index = owner, int32(ent.Index)
	if ent.Own != nil {
		m.own = &hierarchy.Entitlement{Tier: ent.Tier, Own: ent.Own}
	}
	m.state.Store(memoSet)
}

// Source looks one value up.
type Source interface {
	// Lookup returns what the source says of value. found is false when
	// the source knows no such value (a negative answer); err is a
	// failure: the source unreachable, or an answer that is not an
	// entitlement. Lookup honours ctx's deadline and cancellation.
	Lookup(ctx context.Context, value string) (e Entitlement, found bool, err error)
	// Close releases what the source holds. Lookups after Close may fail.
	Close() error
}

// valuePlaceholder is what a key or URL template says where the value goes.
const valuePlaceholder = "{value}"

// parseEntry reads one value's entry: a JSON object such as
// {"plan":"pro","limits":[{"count":100,"per":"h"}],"region":"eu"}.
func parseEntry(raw []byte) (Entitlement, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return Entitlement{}, fmt.Errorf("want an object, not a JSON %s", typeErr.Value)
		}
		return Entitlement{}, err
	}
	if obj == nil {
		return Entitlement{}, errors.New("want an object, not null")
	}
	var e Entitlement
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(obj)) { // errors in a stable order
		v := obj[name]
		if name == "limits" {
			limits, err := parseLimits(v)
			if err != nil {
				errs = append(errs, fmt.Errorf("limits: %w", err))
			}
			e.Limits = limits
			continue
		}
		text, scalar := scalarText(v)
		if name == "plan" {
			switch {
			case isString(v):
				e.Plan = text
			case !bytes.Equal(bytes.TrimSpace(v), []byte("null")):
				errs = append(errs, fmt.Errorf("plan: want a string, not %s", v))
				continue
			}
		}
		if scalar {
			if e.Fields == nil {
				e.Fields = make(map[string]string, len(obj))
			}
			e.Fields[name] = text
		}
	}
	return e, errors.Join(errs...)
}

// parseLimits reads a JSON array of limits, refusing fields a Limit does
// not have (a misspelt "count" must not become a limit of 0). null and []
// are no limits.
func parseLimits(raw []byte) ([]*hierarchy.Limit, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var limits []*hierarchy.Limit
	if err := dec.Decode(&limits); err != nil {
		return nil, err
	}
	for i, l := range limits {
		if l == nil {
			return nil, fmt.Errorf("limit %d is null", i+1)
		}
	}
	if len(limits) == 0 {
		return nil, nil
	}
	return limits, nil
}

// isString reports whether raw is a JSON string.
func isString(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '"'
}

// scalarText is a JSON string's, number's or bool's text (a number as
// written); scalar is false for null, objects and arrays.
func scalarText(raw json.RawMessage) (text string, scalar bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "", false
	}
	switch raw[0] {
	case '"':
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	case 'n', '{', '[':
		return "", false
	default: // a number, true or false
		return string(raw), true
	}
}
