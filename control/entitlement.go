package control

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// Entitlement is a runtime entitlement: one value's plan (and limits of
// its own) in one entitlements source, set by an operator; it wins over
// what the source says until it expires or is deleted: "organisation acme
// is on pro from now on".
//
// It is stored and shared as overrides are (see the package's comment),
// under a field of its own, and expires as they do.
type Entitlement struct {
	// Name names the entitlements block whose source is overruled, as
	// the configuration does.
	Name string `json:"name"`
	// Value is the value the block looks entitlements up by (an org id,
	// an API key…), as clients send it: any bytes, up to 16 KiB.
	Value string `json:"value"`
	// Plan is the plan Value is on. Limits, when given, are Value's own
	// limits. An entitlement has at least one of the two.
	Plan   string             `json:"plan,omitempty"`
	Limits []*hierarchy.Limit `json:"limits,omitempty"`
	// Expires, when set, is when the entitlement ends by itself (the
	// source answers again). The zero time means never.
	Expires time.Time `json:"expires,omitzero"`
	// Note says who set the entitlement and why; at most 1 KiB.
	Note string `json:"note,omitempty"`
	// Updated is when the entitlement was set. SetEntitlement sets it.
	Updated time.Time `json:"updated"`
}

// check validates an entitlement as of now: what SetEntitlement stores.
func (e *Entitlement) check(now time.Time) error {
	if err := checkName("entitlements block", e.Name); err != nil {
		return err
	}
	if len(e.Value) > maxValue {
		return invalid("the value is %d bytes long: at most %d", len(e.Value), maxValue)
	}
	if e.Plan != "" {
		if err := checkName("plan", e.Plan); err != nil {
			return err
		}
	}
	if err := checkNote(e.Note); err != nil {
		return err
	}
	if e.Plan == "" && len(e.Limits) == 0 {
		return invalid("an entitlement needs a plan (such as \"pro\"), limits (such as [{\"count\": 100, \"per\": \"min\"}]), or both")
	}
	if err := checkLimits(e.Limits); err != nil {
		return err
	}
	if !e.Expires.IsZero() && !e.Expires.After(now) {
		return invalid("expires %s is in the past: give a future RFC 3339 time, or omit it", e.Expires.Format(time.RFC3339))
	}
	return nil
}

// checkLimits validates limits as a configuration's are: none null.
func checkLimits(limits []*hierarchy.Limit) error {
	for i, l := range limits {
		if l == nil {
			return invalid("limit %d is null: give a limit such as {\"count\": 100, \"per\": \"min\"}", i+1)
		}
		if err := l.Validate(); err != nil {
			return invalid("limit %d (%s): %v", i+1, l, err)
		}
	}
	return nil
}

// entitlementKey is an entitlement's key in a Snapshot.
type entitlementKey struct{ name, value string }

// Entitlements returns the runtime entitlements in force, sorted by name
// and value. An entitlement past its expiry is never among them.
func (s *Snapshot) Entitlements() []*Entitlement {
	if s == nil {
		return nil
	}
	return s.entitlements
}

// Entitlement returns the runtime entitlement of value in the
// entitlements block name, or nil when there is none (the block's source
// answers). It is one map lookup, for the request path.
func (s *Snapshot) Entitlement(name, value string) *Entitlement {
	if s == nil || len(s.entitlements) == 0 { // the common case: no key hashed
		return nil
	}
	return s.byEntitlement[entitlementKey{name, value}]
}

// readEntitlement decodes an entitlement's field and document; the field
// says its name and value.
func readEntitlement(f string, raw []byte) (*Entitlement, error) {
	name, value, ok := parseEntitlementField(f)
	if !ok {
		return nil, invalid("the field is not a name and a value separated by a NUL byte")
	}
	if len(raw) > maxEntry {
		return nil, invalid("the entry is %d bytes long: at most %d", len(raw), maxEntry)
	}
	e := new(Entitlement)
	if err := json.Unmarshal(raw, e); err != nil {
		return nil, invalid("the entry is not an entitlement's JSON: %v", err)
	}
	e.Name, e.Value = name, value
	return e, nil
}

// SetEntitlement sets the runtime entitlement of e.Value in the
// entitlements block e.Name, replacing any, and returns the one it
// replaced (nil when none). It validates e (an *InvalidError says what to
// fix), stamps the stored copy's Updated, and returns once this instance
// applies it; others do within Poll. e is not modified nor kept.
//
// Whether a block of that name exists, and knows the plan, is the
// caller's to check: the Runtime does not know the configuration.
func (r *Runtime) SetEntitlement(ctx context.Context, e *Entitlement) (old *Entitlement, err error) {
	if e == nil {
		return nil, invalid("no entitlement given")
	}
	if err := e.check(r.now()); err != nil {
		return nil, err
	}
	c := *e
	c.Updated = r.now().UTC()
	if !c.Expires.IsZero() {
		c.Expires = c.Expires.UTC()
	}
	raw, err := json.Marshal(&c)
	if err != nil {
		return nil, fmt.Errorf("control: encoding the entitlement: %w", err)
	}
	field := entitlementField(c.Name, c.Value)
	prev, err := r.write(ctx, "setting the entitlement", field, raw, func(ctx context.Context) ([]byte, error) {
		return r.backend.Set(ctx, field, raw)
	})
	if err != nil {
		return nil, err
	}
	old = oldEntitlement(prev, c.Name, c.Value)
	r.logger.Info("rate limit entitlement set",
		zap.String("entitlements", c.Name), valueNotShown(c.Value),
		entitlementOrNil("old", old), zap.Object("new", entitlementLog{&c}), zap.String("note", c.Note))
	return old, nil
}

// DeleteEntitlement deletes the runtime entitlement of value in the
// entitlements block name, so that the block's source answers for value
// again, and returns it (nil when there was none, which is not an error).
func (r *Runtime) DeleteEntitlement(ctx context.Context, name, value string) (old *Entitlement, err error) {
	if err := checkName("entitlements block", name); err != nil {
		return nil, err
	}
	if len(value) > maxValue {
		return nil, invalid("the value is %d bytes long: at most %d", len(value), maxValue)
	}
	field := entitlementField(name, value)
	prev, err := r.write(ctx, "deleting the entitlement", field, nil, func(ctx context.Context) ([]byte, error) {
		return r.backend.Delete(ctx, field)
	})
	if err != nil || prev == nil {
		return nil, err
	}
	old = oldEntitlement(prev, name, value)
	note := ""
	if old != nil {
		note = old.Note
	}
	r.logger.Info("rate limit entitlement deleted",
		zap.String("entitlements", name), valueNotShown(value), entitlementOrNil("old", old), zap.String("note", note))
	return old, nil
}

// oldEntitlement decodes a replaced entitlement; the field, not the JSON,
// says its name and value.
func oldEntitlement(raw []byte, name, value string) *Entitlement {
	e := decode[Entitlement](raw)
	if e != nil {
		e.Name, e.Value = name, value
	}
	return e
}

// valueNotShown stands for an entitlement's value in a log: a value may
// be a credential (an API key), and the Runtime cannot tell (the
// handlers' ValueShowers know tiers, not entitlements blocks), so it
// writes only the value's length. The note says whose it is.
func valueNotShown(value string) zap.Field {
	return zap.String("value", fmt.Sprintf("(not shown: %d bytes)", len(value)))
}

// entitlementLog logs an entitlement's settings; its name and value are
// fields of their own.
type entitlementLog struct{ e *Entitlement }

func (l entitlementLog) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	e := l.e
	if e.Plan != "" {
		enc.AddString("plan", e.Plan)
	}
	if len(e.Limits) > 0 {
		enc.AddArray("limits", zapcore.ArrayMarshalerFunc(func(a zapcore.ArrayEncoder) error {
			for _, lim := range e.Limits {
				a.AppendString(lim.String())
			}
			return nil
		}))
	}
	if !e.Expires.IsZero() {
		enc.AddString("expires", e.Expires.UTC().Format(time.RFC3339))
	}
	if e.Note != "" {
		enc.AddString("note", e.Note)
	}
	enc.AddString("updated", e.Updated.UTC().Format(time.RFC3339))
	return nil
}

func entitlementOrNil(key string, e *Entitlement) zap.Field {
	if e == nil {
		return zap.Skip()
	}
	return zap.Object(key, entitlementLog{e})
}
