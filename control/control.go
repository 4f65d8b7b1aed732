// Package control holds the runtime state of a running Cascade: the
// per-value limit overrides and per-tree modes an operator sets through the
// admin API while Caddy runs. The state is kept in the store the limits
// live in, so every instance sharing that store applies it, and it
// survives restarts (Redis) or configuration reloads (the memory store).
//
// A [Runtime] holds the state as an immutable [Snapshot] behind an atomic
// pointer. Reading it is one atomic load; a handler never reads the store
// for it on the request path. Instead a handler subscribes
// ([Runtime.Subscribe]) and compiles each new snapshot into its own
// structures when it arrives, off the request path:
//
//	rt, err := control.New(control.NewRedisBackend(client, "cascade:"), control.Options{Logger: logger})
//	...
//	cancel := rt.Subscribe(func(s *control.Snapshot) {
//		for _, o := range s.Overrides() {
//			// install o.Limits for o.Value of tier o.Tier of tree o.Tree
//		}
//	})
//	defer cancel()
//
//	old, err := rt.SetOverride(ctx, &control.Override{
//		Tree: "api", Tier: "org", Value: "acme",
//		Limits:  []*hierarchy.Limit{{Count: 50000, Per: "h"}},
//		Expires: time.Now().Add(24 * time.Hour),
//		Note:    "launch day, ticket #4711",
//	})
//
// # How a change reaches every instance
//
// The state lives in a [Backend]: in the process ([NewMemoryBackend]) or
// in Redis ([NewRedisBackend]), as one hash of fields (one per override
// or mode, each a JSON document) and a version counter. Every change sets
// or deletes one field and increments the version in the same atomic step
// (one Lua script in Redis, lua/control.lua). The Runtime that made a
// change reads the state back and publishes it before the change returns,
// so the instance an operator talks to applies it at once. Every Runtime
// also polls the version (one GET every [Options.Poll], 250ms by default)
// and, when it moved, reloads the hash (HGETALL) and publishes. A change
// is so applied on every instance within Poll plus one round trip: well
// under a second.
//
// Why a polled version rather than Redis pub/sub: a pub/sub message sent
// while an instance is disconnected is lost, and pub/sub has no replay, so
// an instance must reload the whole state after every reconnection anyway,
// and at every start. Reloading when the version moved is that one
// mechanism, used for everything: start, restart, reconnection and change;
// there is no second path to get wrong. It works unchanged on Sentinel
// and on a Cluster (both keys share a hash tag, so they sit in one slot,
// whereas Cluster pub/sub broadcasts every message to every node). Its
// cost is 4 GETs a second per instance, off the request path.
//
// # Expiry
//
// An override may carry an expiry time. An expired override is never in a
// snapshot: every Poll, the Runtime compares the earliest expiry of its
// snapshot with the clock and, once it has passed, publishes a snapshot
// without the override, by its own clock and without asking the backend
// (so an override expires even while Redis is unreachable). It then
// deletes the expired entry from the backend, only if the entry is still
// the one that expired: an override replaced meanwhile is never deleted.
//
// # Failures
//
// A backend that does not answer never takes the state away: New starts
// empty and loads the state when the backend answers; a failed poll keeps
// the last snapshot in force. Writes fail with the backend's error,
// wrapped, which the admin API reports as 503; invalid changes fail with
// an [*InvalidError], which it reports as 400.
//
// # What is trusted
//
// Anyone who can write the backend's keys can write what no admin call
// would, so everything read back is validated as SetOverride and SetMode
// validate: an override that is not valid is left out (the configured
// limits apply), a mode that is not valid counts as enforce, and a
// version that is not one is reset to a fresh one (see
// [BadVersionError]); each is logged at WARN once, when it appears. A
// valid entry is applied whoever wrote it: a key prefix is not a
// security boundary, a Redis ACL is.
package control

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap/zapcore"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// Override replaces a tier's limits for one value of its key, at runtime:
// "organisation acme gets 50,000 requests an hour until Friday". It is the
// runtime counterpart of a value block in the configuration, and wins over
// one until it expires or is deleted.
type Override struct {
	// Tree and Tier name the tier whose limits are replaced.
	Tree string `json:"tree"`
	Tier string `json:"tier"`
	// Value is the value of the tier's key the override applies to, as
	// clients send it (unescaped): any bytes, up to 16 KiB, including
	// ':', '/', NUL, unicode and invalid UTF-8.
	Value string `json:"value"`
	// Limits replace all of the tier's limits for Value. Unlimited
	// exempts Value from the tier instead. An override has exactly one
	// of the two.
	Limits    []*hierarchy.Limit `json:"limits,omitempty"`
	Unlimited bool               `json:"unlimited,omitempty"`
	// Replace says that Limits replace every limit of the tier for Value
	// even when they leave out a dimension the tier counts (its tokens
	// limit, say), which Value then no longer has. Without it the engine
	// refuses such an override, so that an override meant to raise one
	// limit never silently lifts another.
	Replace bool `json:"replace,omitempty"`
	// Expires, when set, is when the override ends by itself. The zero
	// time means never.
	Expires time.Time `json:"expires,omitzero"`
	// Note says who set the override and why; at most 1 KiB.
	Note string `json:"note,omitempty"`
	// Updated is when the override was set. SetOverride sets it (by the
	// clock of the instance that made the change).
	Updated time.Time `json:"updated"`
}

// Mode is a tree's mode set at runtime, which wins over the configured
// one: "enforce" (deny requests over a limit), "warn" (let them through
// and say so in headers and logs) or "shadow" (let them through, record
// only).
type Mode struct {
	Tree string `json:"tree"`
	Mode string `json:"mode"`
	// Note says who set the mode and why; at most 1 KiB.
	Note string `json:"note,omitempty"`
	// Updated is when the mode was set. SetMode sets it.
	Updated time.Time `json:"updated"`
}

// The modes a tree can be put in.
const (
	ModeEnforce = "enforce"
	ModeWarn    = "warn"
	ModeShadow  = "shadow"
)

// Bounds of what is stored: a name is a name, a note a sentence, a value a
// key. Each field is stored whole, read by every instance at every change.
const (
	maxName  = 1 << 10
	maxNote  = 1 << 10
	maxValue = 16 << 10
	// maxEntry bounds one stored JSON document read back: an override at
	// its largest (a 16 KiB value, escaped, and its limits) is well under
	// it; anything larger was not written by Cascade and is not decoded.
	maxEntry = 256 << 10
)

// InvalidError is the error of a change that is not valid, which the
// caller must fix (the admin API answers 400 with its message). Find it
// with errors.As.
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

func invalid(format string, args ...any) error {
	return &InvalidError{fmt.Sprintf(format, args...)}
}

// checkName checks a tree's or tier's name.
func checkName(what, name string) error {
	switch {
	case name == "":
		return invalid("the %s is empty: name the %s, as the configuration does", what, what)
	case len(name) > maxName:
		return invalid("the %s name is %d bytes long: at most %d", what, len(name), maxName)
	case strings.IndexByte(name, 0) >= 0:
		return invalid("the %s name %q contains a NUL byte", what, name)
	}
	return nil
}

func checkNote(note string) error {
	if len(note) > maxNote {
		return invalid("the note is %d bytes long: keep it to %d bytes (say who and why; link a ticket for more)", len(note), maxNote)
	}
	return nil
}

// check validates an override as of now: what SetOverride stores.
func (o *Override) check(now time.Time) error {
	if err := checkName("tree", o.Tree); err != nil {
		return err
	}
	if err := checkName("tier", o.Tier); err != nil {
		return err
	}
	if len(o.Value) > maxValue {
		return invalid("the value is %d bytes long: at most %d", len(o.Value), maxValue)
	}
	if err := checkNote(o.Note); err != nil {
		return err
	}
	switch {
	case o.Unlimited && len(o.Limits) > 0:
		return invalid("an override has limits or is unlimited, not both: drop limits, or unlimited")
	case !o.Unlimited && len(o.Limits) == 0:
		return invalid("an override needs limits (such as [{\"count\": 100, \"per\": \"min\"}]) or \"unlimited\": true")
	}
	for i, l := range o.Limits {
		if l == nil {
			return invalid("limit %d is null: give a limit such as {\"count\": 100, \"per\": \"min\"}", i+1)
		}
		if err := l.Validate(); err != nil {
			return invalid("limit %d (%s): %v", i+1, l, err)
		}
	}
	if !o.Expires.IsZero() && !o.Expires.After(now) {
		return invalid("expires %s is in the past: give a future RFC 3339 time, or omit it", o.Expires.Format(time.RFC3339))
	}
	return nil
}

func checkMode(m *Mode) error {
	if err := checkName("tree", m.Tree); err != nil {
		return err
	}
	switch m.Mode {
	case ModeEnforce, ModeWarn, ModeShadow:
	default:
		return invalid("mode %q: use %s, %s or %s", m.Mode, ModeEnforce, ModeWarn, ModeShadow)
	}
	return checkNote(m.Note)
}

// Fields of the backend. An override's field is "o", NUL, tree, NUL, tier,
// NUL, value; a mode's is "m", NUL, tree; an entitlement's is "e", NUL,
// entitlements block, NUL, value. Names contain no NUL (checked) and the
// value comes last, so any bytes in a value keep the field unambiguous.
// The field, not the JSON document, is the authority on a field's names
// and value: JSON cannot carry invalid UTF-8.
const (
	overridePrefix    = "o\x00"
	modePrefix        = "m\x00"
	entitlementPrefix = "e\x00"
)

func overrideField(tree, tier, value string) string {
	return overridePrefix + tree + "\x00" + tier + "\x00" + value
}

func modeField(tree string) string { return modePrefix + tree }

// parseOverrideField returns the tree, tier and value of an override's
// field.
func parseOverrideField(f string) (tree, tier, value string, ok bool) {
	rest, ok := strings.CutPrefix(f, overridePrefix)
	if !ok {
		return "", "", "", false
	}
	tree, rest, ok1 := strings.Cut(rest, "\x00")
	tier, value, ok2 := strings.Cut(rest, "\x00")
	return tree, tier, value, ok1 && ok2
}

func entitlementField(name, value string) string {
	return entitlementPrefix + name + "\x00" + value
}

// parseEntitlementField returns the entitlements block's name and the
// value of an entitlement's field.
func parseEntitlementField(f string) (name, value string, ok bool) {
	rest, ok := strings.CutPrefix(f, entitlementPrefix)
	if !ok {
		return "", "", false
	}
	return strings.Cut(rest, "\x00")
}

// clip shortens s to at most 256 bytes for a log line, at a character
// boundary, and says that it did.
func clip(s string) string {
	const n = 256
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > n-utf8.UTFMax && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", s[:cut], len(s))
}

// overrideLog logs an override's settings; its tree, tier and value are
// fields of their own (the value clipped).
type overrideLog struct{ o *Override }

func (l overrideLog) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	o := l.o
	if o.Unlimited {
		enc.AddBool("unlimited", true)
	}
	if len(o.Limits) > 0 {
		enc.AddArray("limits", zapcore.ArrayMarshalerFunc(func(a zapcore.ArrayEncoder) error {
			for _, lim := range o.Limits {
				a.AppendString(lim.String())
			}
			return nil
		}))
	}
	if !o.Expires.IsZero() {
		enc.AddString("expires", o.Expires.UTC().Format(time.RFC3339))
	}
	if o.Note != "" {
		enc.AddString("note", o.Note)
	}
	enc.AddString("updated", o.Updated.UTC().Format(time.RFC3339))
	return nil
}

// decode reads a field's old value as returned by a backend; nil when
// none, or not readable.
func decode[T any](raw []byte) *T {
	if raw == nil {
		return nil
	}
	v := new(T)
	if json.Unmarshal(raw, v) != nil {
		return nil
	}
	return v
}
