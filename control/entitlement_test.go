package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestEntitlementChanges: set, replace and delete entitlements through one
// Runtime, on every backend; each returns what it replaced, applies before
// it returns and calls the subscriber once; an override of the same
// strings is another entry.
func TestEntitlementChanges(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			ctx := context.Background()
			c := newClock()
			r := open(t, bc.shared(t)(), Options{Poll: time.Hour, Now: c.Now})
			if _, err := r.SetOverride(ctx, &Override{Tree: "customers", Tier: "acme", Value: "acme", Unlimited: true}); err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			r.Subscribe(rec.fn)

			steps := []struct {
				name   string
				do     func() (*Entitlement, error)
				old    string // the old value's JSON, "null" for none
				notify bool
				check  func(s *Snapshot) error
			}{
				{"set", func() (*Entitlement, error) {
					return r.SetEntitlement(ctx, &Entitlement{Name: "customers", Value: "acme", Plan: "pro", Note: "upgraded, ticket #12"})
				}, "null", true, func(s *Snapshot) error {
					e := s.Entitlement("customers", "acme")
					if e == nil || e.Plan != "pro" || e.Note != "upgraded, ticket #12" || !e.Updated.Equal(c.Now()) {
						return fmt.Errorf("entitlement %+v", e)
					}
					return nil
				}},
				{"replace", func() (*Entitlement, error) {
					c.Advance(time.Minute)
					return r.SetEntitlement(ctx, &Entitlement{Name: "customers", Value: "acme", Plan: "enterprise", Limits: perHour(90000)})
				}, `{"name":"customers","value":"acme","plan":"pro","note":"upgraded, ticket #12","updated":"2026-11-24T16:00:00Z"}`, true,
					func(s *Snapshot) error {
						if e := s.Entitlement("customers", "acme"); e == nil || e.Plan != "enterprise" || e.Limits[0].Count != 90000 {
							return fmt.Errorf("entitlement %+v", e)
						}
						return nil
					}},
				{"limits only, another block", func() (*Entitlement, error) {
					return r.SetEntitlement(ctx, &Entitlement{Name: "api-keys", Value: "sk-1", Limits: perHour(10)})
				}, "null", true, func(s *Snapshot) error {
					if e := s.Entitlement("api-keys", "sk-1"); e == nil || e.Plan != "" || len(e.Limits) != 1 {
						return fmt.Errorf("entitlement %+v", e)
					}
					return nil
				}},
				{"a second value", func() (*Entitlement, error) {
					return r.SetEntitlement(ctx, &Entitlement{Name: "customers", Value: "beta", Plan: "free"})
				}, "null", true, func(s *Snapshot) error {
					var got []string
					for _, e := range s.Entitlements() {
						got = append(got, e.Name+"/"+e.Value)
					}
					if strings.Join(got, " ") != "api-keys/sk-1 customers/acme customers/beta" {
						return fmt.Errorf("entitlements %q, want sorted by name and value", got)
					}
					return nil
				}},
				{"delete", func() (*Entitlement, error) { return r.DeleteEntitlement(ctx, "customers", "acme") },
					`{"name":"customers","value":"acme","plan":"enterprise","limits":[{"count":90000,"per":"h"}],"updated":"2026-11-24T16:01:00Z"}`, true,
					func(s *Snapshot) error {
						if s.Entitlement("customers", "acme") != nil || len(s.Entitlements()) != 2 {
							return fmt.Errorf("entitlements %v", s.Entitlements())
						}
						return nil
					}},
				{"delete again", func() (*Entitlement, error) { return r.DeleteEntitlement(ctx, "customers", "acme") }, "null", false, nil},
			}
			for _, st := range steps {
				before, version := rec.count(), r.Snapshot().Version()
				old, err := st.do()
				if err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				if got, _ := json.Marshal(old); string(got) != st.old {
					t.Errorf("%s: old = %s, want %s", st.name, got, st.old)
				}
				want := before
				if st.notify {
					want++
				}
				if rec.count() != want {
					t.Errorf("%s: the subscriber was called %d times, want %d", st.name, rec.count()-before, want-before)
				}
				if st.check != nil {
					for who, s := range map[string]*Snapshot{"snapshot": r.Snapshot(), "the subscriber's snapshot": rec.last()} {
						if err := st.check(s); err != nil {
							t.Errorf("%s: %s: %v", st.name, who, err)
						}
					}
					if r.Snapshot().Version() <= version {
						t.Errorf("%s: version %d did not grow from %d", st.name, r.Snapshot().Version(), version)
					}
				}
			}
			if s := r.Snapshot(); s.Override("customers", "acme", "acme") == nil || len(s.Overrides()) != 1 {
				t.Fatal("entitlements disturbed an override")
			}
		})
	}
}

// TestEntitlementSharedThroughRedis: an entitlement set through one
// instance reaches another, each with its own client, at its next poll
// (every 250 ms, the default) and calls its subscriber; a new instance
// (a restart) loads it; a deletion through the other reaches the first.
func TestEntitlementSharedThroughRedis(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	prefix := testPrefix(t)
	instance := func() *Runtime { return open(t, NewRedisBackend(redisClient(t, addr), prefix), Options{}) }
	a, b := instance(), instance()
	rec := &recorder{}
	b.Subscribe(rec.fn)
	ctx := context.Background()
	value := "org/組織:\x00" + strings.Repeat("x", 1<<10)

	if _, err := a.SetEntitlement(ctx, &Entitlement{Name: "customers", Value: value, Plan: "pro", Note: "deal"}); err != nil {
		t.Fatal(err)
	}
	if a.Snapshot().Entitlement("customers", value) == nil {
		t.Fatal("the writer did not apply its own change before returning")
	}
	took := waitFor(t, "B's subscriber sees A's entitlement", func() bool {
		return rec.count() == 2 && rec.last().Entitlement("customers", value) != nil
	})
	t.Logf("the other instance applied the entitlement after %v", took)
	if e := b.Snapshot().Entitlement("customers", value); e == nil || e.Plan != "pro" || e.Note != "deal" || e.Value != value {
		t.Fatalf("B's entitlement: %+v", e)
	}

	restarted := instance()
	if e := restarted.Snapshot().Entitlement("customers", value); e == nil || e.Plan != "pro" {
		t.Fatal("a new instance did not load the entitlement")
	}

	old, err := b.DeleteEntitlement(ctx, "customers", value)
	if err != nil || old == nil || old.Value != value || old.Plan != "pro" {
		t.Fatalf("delete through B: %+v %v", old, err)
	}
	waitFor(t, "A and the new instance see B's deletion", func() bool {
		return a.Snapshot().Entitlement("customers", value) == nil && restarted.Snapshot().Entitlement("customers", value) == nil
	})
}

// TestEntitlementExpiry: an entitlement goes when its time comes, without
// any write and with no override to expire beside it: a poll publishes a
// snapshot without it, calls the subscribers, and removes it from the
// backend; the one that never expires stays.
func TestEntitlementExpiry(t *testing.T) {
	for _, bc := range backendCases() {
		t.Run(bc.name, func(t *testing.T) {
			c := newClock()
			backend := &polled{Backend: bc.shared(t)()}
			r := open(t, backend, Options{Poll: 5 * time.Millisecond, Now: c.Now})
			rec := &recorder{}
			r.Subscribe(rec.fn)
			ctx := context.Background()
			for _, e := range []*Entitlement{
				{Name: "customers", Value: "trial", Plan: "pro", Expires: c.Now().Add(time.Hour)},
				{Name: "customers", Value: "forever", Plan: "pro"},
			} {
				if _, err := r.SetEntitlement(ctx, e); err != nil {
					t.Fatal(err)
				}
			}
			calls := rec.count()
			c.Advance(time.Hour - time.Nanosecond)
			waitPolls(t, backend, 3) // which must find nothing to do
			if len(r.Snapshot().Entitlements()) != 2 || rec.count() != calls {
				t.Fatal("an entitlement went before its time")
			}

			c.Advance(time.Nanosecond)
			waitFor(t, "a snapshot without the expired entitlement", func() bool {
				return rec.count() > calls && rec.last().Entitlement("customers", "trial") == nil
			})
			if s := r.Snapshot(); s.Entitlement("customers", "forever") == nil || len(s.Entitlements()) != 1 {
				t.Fatalf("after the expiry: %v", s.Entitlements())
			}
			waitFor(t, "the expired entry pruned from the backend", func() bool {
				_, fields, err := backend.Load(ctx)
				return err == nil && len(fields) == 1 && fields[entitlementField("customers", "trial")] == nil
			})
		})
	}
}

// TestEntitlementValidation: what SetEntitlement and DeleteEntitlement
// refuse, with an *InvalidError saying what to fix, storing nothing.
func TestEntitlementValidation(t *testing.T) {
	c := newClock()
	r := open(t, NewMemoryBackend(), Options{Poll: time.Hour, Now: c.Now})
	ctx := context.Background()
	base := Entitlement{Name: "customers", Value: "acme", Plan: "pro"}
	set := func(change func(e *Entitlement)) func() error {
		return func() error {
			e := base
			change(&e)
			_, err := r.SetEntitlement(ctx, &e)
			return err
		}
	}
	for _, tt := range []struct {
		name string
		do   func() error
		says string
	}{
		{"nil", func() error { _, err := r.SetEntitlement(ctx, nil); return err }, "no entitlement given"},
		{"no name", set(func(e *Entitlement) { e.Name = "" }), "the entitlements block is empty"},
		{"NUL in name", set(func(e *Entitlement) { e.Name = "a\x00b" }), "NUL"},
		{"long name", set(func(e *Entitlement) { e.Name = strings.Repeat("n", 2000) }), "at most 1024"},
		{"long value", set(func(e *Entitlement) { e.Value = strings.Repeat("v", 16<<10+1) }), "the value is 16385 bytes long"},
		{"NUL in plan", set(func(e *Entitlement) { e.Plan = "p\x00" }), `the plan name "p\x00" contains a NUL byte`},
		{"long note", set(func(e *Entitlement) { e.Note = strings.Repeat("n", 1025) }), "the note is 1025 bytes long"},
		{"neither plan nor limits", set(func(e *Entitlement) { e.Plan = "" }), "needs a plan"},
		{"null limit", set(func(e *Entitlement) { e.Limits = []*hierarchy.Limit{nil} }), "limit 1 is null"},
		{"bad limit", set(func(e *Entitlement) {
			e.Limits = []*hierarchy.Limit{{Count: 1, Per: "h"}, {Count: 1, Per: "fortnight"}}
		}), "limit 2 (1/fortnight)"},
		{"past", set(func(e *Entitlement) { e.Expires = c.Now().Add(-time.Second) }),
			"expires 2026-11-24T15:59:59Z is in the past: give a future RFC 3339 time, or omit it"},
		{"now", set(func(e *Entitlement) { e.Expires = c.Now() }), "in the past"},
		{"delete without name", func() error { _, err := r.DeleteEntitlement(ctx, "", "acme"); return err }, "the entitlements block is empty"},
		{"delete a long value", func() error {
			_, err := r.DeleteEntitlement(ctx, "customers", strings.Repeat("v", 16<<10+1))
			return err
		}, "16385 bytes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			var inv *InvalidError
			if !errors.As(err, &inv) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("error %v, want an *InvalidError saying %q", err, tt.says)
			}
		})
	}
	if s := r.Snapshot(); len(s.Entitlements()) != 0 || s.Version() != 0 {
		t.Fatalf("an invalid change reached the store: version %d", s.Version())
	}
	// The bounds themselves are fine, and the caller's entitlement is
	// neither changed nor kept.
	given := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	e := &Entitlement{Name: "customers", Value: strings.Repeat("v", 16<<10), Limits: perHour(5), Note: strings.Repeat("n", 1024),
		Expires: c.Now().Add(time.Second), Updated: given}
	if _, err := r.SetEntitlement(ctx, e); err != nil {
		t.Fatalf("an entitlement at the bounds: %v", err)
	}
	e.Limits[0].Count = 99
	got := r.Snapshot().Entitlement("customers", e.Value)
	if !e.Updated.Equal(given) || got.Limits[0].Count != 5 || !got.Updated.Equal(c.Now()) {
		t.Fatalf("stored %+v (limit %d); the caller's updated %v", got, got.Limits[0].Count, e.Updated)
	}
}

// TestEntitlementJSON: an entitlement's JSON, with an unset expiry and
// plan left out.
func TestEntitlementJSON(t *testing.T) {
	for _, tt := range []struct {
		e    Entitlement
		want string
	}{
		{Entitlement{Name: "customers", Value: "a:b/ç", Plan: "pro", Expires: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), Note: "pilot",
			Updated: time.Date(2026, 11, 24, 16, 0, 0, 0, time.UTC)},
			`{"name":"customers","value":"a:b/ç","plan":"pro","expires":"2026-12-01T00:00:00Z","note":"pilot","updated":"2026-11-24T16:00:00Z"}`},
		{Entitlement{Name: "keys", Value: "k", Limits: []*hierarchy.Limit{{Count: 5, Per: "month", Dimension: "tokens", Algorithm: "calendar", Timezone: "UTC"}}},
			`{"name":"keys","value":"k","limits":[{"count":5,"per":"month","dimension":"tokens","algorithm":"calendar","timezone":"UTC"}],"updated":"0001-01-01T00:00:00Z"}`},
	} {
		raw, err := json.Marshal(&tt.e)
		if err != nil || string(raw) != tt.want {
			t.Errorf("JSON\n got %s %v\nwant %s", raw, err, tt.want)
		}
	}
}

// TestStoredEntitlementsValidated: entitlements no admin call would
// store, written into the backend directly, are left out and logged once;
// the field, not the document, names the block and the value.
func TestStoredEntitlementsValidated(t *testing.T) {
	mem := NewMemoryBackend()
	ctx := context.Background()
	c := newClock()
	for f, doc := range map[string]string{
		entitlementField("customers", "json"):         `{not json`,
		entitlementField("customers", "empty"):        `{}`,
		entitlementField("customers", "null"):         `{"limits":[null]}`,
		entitlementField("", "noname"):                `{"plan":"pro"}`,
		"e\x00no-value-separator":                     `{"plan":"pro"}`,
		entitlementField("customers", "expired"):      `{"plan":"pro","expires":"2026-11-24T15:00:00Z"}`,
		entitlementField("customers", "good\xff\x00"): `{"name":"other","value":"other","plan":"pro"}`,
	} {
		mem.Set(ctx, f, []byte(doc))
	}
	core, logs := observer.New(zapcore.WarnLevel)
	r := open(t, mem, Options{Poll: time.Hour, Now: c.Now, Logger: zap.New(core)})
	s := r.Snapshot()
	if e := s.Entitlement("customers", "good\xff\x00"); len(s.Entitlements()) != 1 || e == nil || e.Name != "customers" || e.Plan != "pro" {
		t.Fatalf("entitlements kept: %+v, want only the valid one, named by its field", s.Entitlements())
	}
	if n := logs.Len(); n != 5 {
		t.Fatalf("%d warnings, want 5: one per entry that is not valid (the expired one is pruned, not logged)", n)
	}
	for _, e := range logs.AllUntimed() {
		if v, _ := e.ContextMap()["value"].(string); v != "" && !strings.HasPrefix(v, "(not shown") {
			t.Errorf("%s: the value is logged: %q", e.Message, v)
		}
	}
}

func TestNilSnapshotEntitlements(t *testing.T) {
	var s *Snapshot
	if s.Entitlements() != nil || s.Entitlement("a", "b") != nil {
		t.Fatal("a nil snapshot has entitlements")
	}
}
