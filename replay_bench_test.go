package cascade

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

// BenchmarkHandlerReplay is the handler's cost per POST with an
// idempotency key under replay, on the memory store and on Redis, for a
// response of 1 KiB and of 1 MiB: "first" runs the upstream (a handler
// writing the response) and keeps its response; "replayed" answers from
// the store; "nokey" is the same request without a key, for comparison.
// Each request's body is 16 bytes, hashed.
func BenchmarkHandlerReplay(b *testing.B) {
	for _, st := range []string{"memory", "redis"} {
		for _, size := range []int{1 << 10, 1 << 20} {
			for _, kind := range []string{"nokey", "first", "replayed"} {
				b.Run(fmt.Sprintf("%s/%dKiB/%s", st, size>>10, kind), func(b *testing.B) {
					benchReplay(b, st, size, kind)
				})
			}
		}
	}
}

func benchReplay(b *testing.B, st string, size int, kind string) {
	replayed := kind == "replayed"
	store := map[string]any{"memory": map[string]any{"name": b.Name(), "max_replay_bytes": 1 << 30}}
	if st == "redis" {
		store = map[string]any{"redis": map[string]any{"addresses": []string{redistest.Shared(b).Addr()},
			"key_prefix": fmt.Sprintf("replaybench%d:", time.Now().UnixNano()), "insecure_bus": true}}
	}
	h, done := benchHandlerOf(b, 1, nil, map[string]any{
		"idempotency": map[string]any{"replay": true, "max_body": 2 << 20},
		"store":       store,
	})
	defer done()
	response := bytes.Repeat([]byte("x"), size)
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write(response)
		return err
	})
	body := []byte(`{"amount":12345}`)
	serve := func(key int) int {
		r := httptest.NewRequest("POST", "/charges", bytes.NewReader(body))
		r.Header.Set("X-T0", "alice")
		if kind != "nokey" {
			r.Header.Set("Idempotency-Key", strconv.Itoa(key))
		}
		repl := caddy.NewReplacer()
		r = r.WithContext(context.WithValue(r.Context(), caddy.ReplacerCtxKey, repl))
		w := &headerWriter{hdr: http.Header{}}
		if err := h.ServeHTTP(w, r, next); err != nil {
			b.Fatal(err)
		}
		return w.code
	}
	const keys = 1000
	if replayed {
		for k := range keys {
			serve(k)
		}
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		key := n + keys // a new key each time
		if replayed {
			key = n % keys
		}
		if code := serve(key); code != http.StatusCreated {
			b.Fatalf("status %d", code)
		}
	}
}
