package storetest

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/store"
)

// RunResponses runs the conformance suite of kept responses
// (store.Responses) against the stores open makes, which must implement
// it: a miss is nil, a response reads back byte for byte and is replaced
// by the next, neither the slice kept nor the one read is shared with the
// store, and a response expires at its TTL.
//
// Expiry is checked on both clocks at once, so that one scenario holds
// for the memory store (the injected clock) and Redis (its own, PX): a
// response is still there when the injected clock is a moment short of its
// TTL, and gone once both the injected clock and the wall clock have
// passed a short one.
func RunResponses(t *testing.T, open Opener) {
	ctx := context.Background()
	responses := func(t *testing.T, clock *Clock) store.Responses {
		t.Helper()
		s := open(t, clock.Now)
		rs, ok := s.(store.Responses)
		if !ok {
			t.Fatalf("%T does not implement store.Responses", s)
		}
		return rs
	}
	keep := func(t *testing.T, rs store.Responses, key string, response []byte, ttl time.Duration) {
		t.Helper()
		if err := rs.KeepResponse(ctx, key, response, ttl); err != nil {
			t.Fatalf("KeepResponse(%s, %d bytes): %v", key, len(response), err)
		}
	}
	expect := func(t *testing.T, rs store.Responses, key string, want []byte) []byte {
		t.Helper()
		got, _, err := rs.Response(ctx, key)
		switch {
		case err != nil:
			t.Fatalf("Response(%s): %v", key, err)
		case want == nil && got != nil:
			t.Fatalf("Response(%s) = %d bytes, want none", key, len(got))
		case want != nil && (got == nil || !bytes.Equal(got, want)):
			t.Fatalf("Response(%s) = %d bytes (nil %v), want the %d kept", key, len(got), got == nil, len(want))
		}
		return got
	}

	for _, tc := range []struct {
		name string
		run  func(t *testing.T, clock *Clock, rs store.Responses)
	}{
		{"a key never kept has none", func(t *testing.T, _ *Clock, rs store.Responses) {
			expect(t, rs, key("resp-miss", "k"), nil)
		}},
		{"a response reads back byte for byte", func(t *testing.T, _ *Clock, rs store.Responses) {
			for _, n := range []int{1, store.ResponseHead, store.ResponseHead + 1, 1 << 10, 1 << 20} {
				r := Blob(n)
				keep(t, rs, key("resp-get", "k"), r, time.Hour)
				expect(t, rs, key("resp-get", "k"), r)
			}
		}},
		{"an empty response is kept, not none", func(t *testing.T, _ *Clock, rs store.Responses) {
			keep(t, rs, key("resp-empty", "k"), []byte{}, time.Hour)
			if got := expect(t, rs, key("resp-empty", "k"), []byte{}); got == nil {
				t.Fatal("an empty response read back as none")
			}
		}},
		{"reads are counted, from 0 again when kept again", func(t *testing.T, _ *Clock, rs store.Responses) {
			k := key("resp-reads", "k")
			if _, n, _ := rs.Response(ctx, k); n != 0 {
				t.Fatalf("a response never kept: %d reads, want 0", n)
			}
			keep(t, rs, k, []byte("one"), time.Hour)
			for want := int64(1); want <= 3; want++ {
				if got, n, err := rs.Response(ctx, k); err != nil || string(got) != "one" || n != want {
					t.Fatalf("read %d: %q, %d reads, %v", want, got, n, err)
				}
			}
			keep(t, rs, k, []byte("two"), time.Hour)
			if got, n, err := rs.Response(ctx, k); err != nil || string(got) != "two" || n != 1 {
				t.Fatalf("after keeping again: %q, %d reads, %v; want 1 read", got, n, err)
			}
		}},
		{"a reset of limit state leaves kept responses", func(t *testing.T, _ *Clock, rs store.Responses) {
			rt, ok := rs.(store.Resetter)
			if !ok {
				t.Skip("the store has no resets")
			}
			k := key("resp-reset", "k#idempotency=1") + store.ResponseKeySuffix
			keep(t, rs, k, []byte("kept"), time.Hour)
			prefix := key("resp-reset", "")
			if _, err := rt.ResetMatching(context.Background(), store.KeyMatch{Glob: "{conf|resp-reset}*",
				Match: func(s string) bool { return strings.HasPrefix(s, prefix) }}); err != nil {
				t.Fatal(err)
			}
			expect(t, rs, k, []byte("kept"))
		}},
		{"a response replaces the one kept before", func(t *testing.T, _ *Clock, rs store.Responses) {
			k := key("resp-replace", "k")
			keep(t, rs, k, Blob(4096), time.Hour)
			second := Blob(100)
			keep(t, rs, k, second, time.Hour)
			expect(t, rs, k, second)
		}},
		{"keys of one hash tag are apart", func(t *testing.T, _ *Clock, rs store.Responses) {
			a, b := Blob(300), Blob(301)
			keep(t, rs, key("resp-apart", "a"), a, time.Hour)
			keep(t, rs, key("resp-apart", "b"), b, time.Hour)
			expect(t, rs, key("resp-apart", "a"), a)
			expect(t, rs, key("resp-apart", "b"), b)
		}},
		{"the store shares no slice with its caller", func(t *testing.T, _ *Clock, rs store.Responses) {
			k := key("resp-copy", "k")
			in := Blob(1000)
			want := bytes.Clone(in)
			keep(t, rs, k, in, time.Hour)
			in[0]++ // the caller reuses its buffer
			out := expect(t, rs, k, want)
			out[1]++ // the caller writes what it read
			expect(t, rs, k, want)
		}},
		{"a response expires at its ttl", func(t *testing.T, clock *Clock, rs store.Responses) {
			long, short := key("resp-ttl", "long"), key("resp-ttl", "short")
			r := Blob(200)
			keep(t, rs, long, r, time.Hour)
			keep(t, rs, short, r, 20*time.Millisecond)
			clock.Advance(time.Hour - time.Second)
			expect(t, rs, long, r)
			time.Sleep(30 * time.Millisecond) // the wall clock past the short TTL: Redis's
			expect(t, rs, short, nil)
		}},
		{"a ttl under a millisecond still keeps", func(t *testing.T, _ *Clock, rs store.Responses) {
			// Kept for a millisecond: only the call is checked, the
			// response may be gone by the time it is read.
			keep(t, rs, key("resp-zero", "k"), Blob(10), 0)
			keep(t, rs, key("resp-zero", "k"), Blob(10), time.Microsecond)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := NewClock(start)
			tc.run(t, clock, responses(t, clock))
		})
	}
}

// Blob is n bytes of a response, random but for its first byte, which is
// its length modulo 256: a test's responses are told apart.
func Blob(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	if n > 0 {
		b[0] = byte(n)
	}
	return b
}
