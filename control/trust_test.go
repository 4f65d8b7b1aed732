package control

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// TestStoredStateValidated: entries no admin call would store, written
// into the backend directly, are validated as SetOverride and SetMode
// validate: a mode that is not valid counts as enforce, an override that
// is not valid is left out; each is logged once when it appears or
// changes, not at every install.
func TestStoredStateValidated(t *testing.T) {
	mem := NewMemoryBackend()
	ctx := context.Background()
	c := newClock()
	long := strings.Repeat("n", maxNote+1)
	mem.Set(ctx, modeField("api"), []byte(`{"mode":"x"}`))
	mem.Set(ctx, modeField("web"), []byte(`{not json`))
	mem.Set(ctx, modeField("ok"), []byte(`{"mode":"shadow"}`))
	mem.Set(ctx, overrideField("api", "user", "null"), []byte(`{"limits":[null]}`))
	mem.Set(ctx, overrideField("api", "user", "both"), []byte(`{"unlimited":true,"limits":[{"count":1,"per":"min"}]}`))
	mem.Set(ctx, overrideField("api", "user", "note"), []byte(`{"unlimited":true,"note":"`+long+`"}`))
	mem.Set(ctx, overrideField("api", "user", "zero"), []byte(`{"limits":[{"count":0,"per":"min"}]}`))
	mem.Set(ctx, overrideField("api", "", "noname"), []byte(`{"unlimited":true}`))
	mem.Set(ctx, overrideField("api", "user", strings.Repeat("v", maxValue+1)), []byte(`{"unlimited":true}`))
	mem.Set(ctx, overrideField("api", "user", "big"), []byte(`{"unlimited":true,"note":"`+strings.Repeat(" ", maxEntry)+`"}`))
	mem.Set(ctx, overrideField("api", "user", "good"), []byte(`{"limits":[{"count":5,"per":"min"}],"replace":true}`))
	core, logs := observer.New(zapcore.WarnLevel)
	b := &polled{Backend: mem}
	r := open(t, b, Options{Poll: time.Millisecond, Now: c.Now, Logger: zap.New(core)})

	s := r.Snapshot()
	if m := s.Mode("api"); m == nil || m.Mode != ModeEnforce {
		t.Errorf("mode \"x\" in the store: %+v, want enforce", m)
	}
	if m := s.Mode("web"); m == nil || m.Mode != ModeEnforce {
		t.Errorf("a mode that does not decode: %+v, want enforce", m)
	}
	if m := s.Mode("ok"); m == nil || m.Mode != ModeShadow {
		t.Errorf("a valid mode: %+v", m)
	}
	if len(s.Overrides()) != 1 || s.Override("api", "user", "good") == nil || !s.Override("api", "user", "good").Replace {
		for _, o := range s.Overrides() {
			t.Logf("kept: %s/%s/%.20q", o.Tree, o.Tier, o.Value)
		}
		t.Fatalf("%d overrides kept, want only the valid one (with replace)", len(s.Overrides()))
	}
	const bad = 9 // 2 modes, 7 overrides
	if n := logs.Len(); n != bad {
		t.Fatalf("%d warnings, want %d: one per entry that is not valid", n, bad)
	}

	// Polls and a reinstall of the same state log nothing more.
	waitPolls(t, b, 3)
	mem.Set(ctx, modeField("ok"), []byte(`{"mode":"warn"}`))
	waitFor(t, "the change is applied", func() bool { return r.Snapshot().Mode("ok").Mode == ModeWarn })
	if n := logs.Len(); n != bad {
		t.Fatalf("%d warnings after polls and a valid change, want still %d", n, bad)
	}
	// A bad entry that changes is logged again.
	mem.Set(ctx, modeField("api"), []byte(`{"mode":"y"}`))
	waitFor(t, "the changed bad mode is logged", func() bool { return logs.Len() == bad+1 })
	if m := r.Snapshot().Mode("api"); m.Mode != ModeEnforce {
		t.Fatalf("mode \"y\": %q", m.Mode)
	}
}

// TestBadVersionRepaired: a version key that is not a version (written
// by something other than Cascade) neither keeps the state from loading
// nor fails later changes: it is reset to a fresh version, once, which
// every instance follows.
func TestBadVersionRepaired(t *testing.T) {
	srv := redistest.Shared(t)
	for _, bad := range []string{"garbage", "-3", "9223372036854775807"} {
		t.Run(bad, func(t *testing.T) {
			prefix := testPrefix(t)
			// Whichever instance polls first repairs the version and logs
			// it: both log to logs.
			core, logs := observer.New(zapcore.WarnLevel)
			a := open(t, NewRedisBackend(redisClient(t, srv.Addr()), prefix), Options{Poll: 5 * time.Millisecond, Logger: zap.New(core)})
			ctx := context.Background()
			if _, err := a.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v1", Unlimited: true}); err != nil {
				t.Fatal(err)
			}
			b := open(t, NewRedisBackend(redisClient(t, srv.Addr()), prefix), Options{Poll: 5 * time.Millisecond, Logger: zap.New(core)})

			// A restrictive override appears with a version that is not
			// one: both instances load it.
			version := prefix + "{cascade-control}version"
			if _, err := redistest.Do(srv.Addr(), "HSET", prefix+"{cascade-control}state", overrideField("t", "u", "v2"), `{"limits":[{"count":1,"per":"min"}]}`); err != nil {
				t.Fatal(err)
			}
			if _, err := redistest.Do(srv.Addr(), "SET", version, bad); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "both instances load the override", func() bool {
				return a.Snapshot().Override("t", "u", "v2") != nil && b.Snapshot().Override("t", "u", "v2") != nil
			})
			v, err := redistest.Do(srv.Addr(), "GET", version)
			if err != nil || v == bad || strings.Trim(v, "0123456789") != "" {
				t.Fatalf("version after the repair: %q %v", v, err)
			}

			// Set it bad again: a change through b still succeeds, and a sees it.
			if _, err := redistest.Do(srv.Addr(), "SET", version, bad); err != nil {
				t.Fatal(err)
			}
			if _, err := b.SetOverride(ctx, &Override{Tree: "t", Tier: "u", Value: "v3", Unlimited: true}); err != nil {
				t.Fatalf("a change on a version that is not valid: %v", err)
			}
			waitFor(t, "a sees b's change", func() bool { return a.Snapshot().Override("t", "u", "v3") != nil })
			if logs.FilterMessageSnippet("was not valid").Len() == 0 {
				t.Errorf("the repair was not logged: %v", logs.All())
			}
		})
	}
}

// FuzzSnapshot: whatever a store holds, building the snapshot neither
// panics nor publishes an override or a mode that an admin call would
// refuse.
func FuzzSnapshot(f *testing.F) {
	f.Add("o\x00api\x00user\x00alice", []byte(`{"limits":[{"count":5,"per":"min","dimension":"tokens"}],"note":"n"}`))
	f.Add("o\x00api\x00user\x00alice", []byte(`{"limits":[null]}`))
	f.Add("o\x00api\x00user\x00alice", []byte(`{"unlimited":true,"expires":"2026-11-24T17:00:00Z","replace":true}`))
	f.Add("o\x00api\x00user\x00alice", []byte(`{"limits":[{"count":5,"per":"month","algorithm":"calendar","timezone":"Europe/Paris"}]}`))
	f.Add("m\x00api", []byte(`{"mode":"x"}`))
	f.Add("m\x00api", []byte(`{"mode":"shadow","note":"n"}`))
	f.Add("m\x00", []byte(`{"mode":"warn"}`))
	f.Add("o\x00a", []byte(`{}`))
	now := time.Date(2026, 11, 24, 16, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, field string, raw []byte) {
		b := build(1, map[string][]byte{field: raw}, now)
		for _, o := range b.snap.Overrides() {
			if err := o.check(now); err != nil {
				t.Fatalf("published an override an admin call refuses: %v", err)
			}
			if b.snap.Override(o.Tree, o.Tier, o.Value) != o {
				t.Fatal("an override is not found by its key")
			}
		}
		for _, m := range b.snap.Modes() {
			if err := checkMode(m); err != nil {
				t.Fatalf("published a mode an admin call refuses: %v", err)
			}
		}
		if rej, ok := b.rejected[field]; ok && rej.enforced != (b.live[field] != nil) {
			t.Fatal("a mode that is not valid is not in force as enforce")
		}
	})
}
