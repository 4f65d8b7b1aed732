package store_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// TestFingerprintSecretShared: instances sharing a Redis and a key prefix
// read one secret, made by the first; another prefix has its own.
func TestFingerprintSecretShared(t *testing.T) {
	addr := redistest.Shared(t).Addr()
	ctx := context.Background()
	open := func(prefix string) *store.Redis {
		r, err := store.NewRedis(ctx, store.RedisOptions{Addrs: []string{addr}, KeyPrefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r
	}
	prefix := fmt.Sprintf("fp%p:", t)
	a, err := open(prefix).FingerprintSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := open(prefix).FingerprintSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c, err := open(prefix + "other:").FingerprintSecret(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(a) < 32 || !bytes.Equal(a, b) || bytes.Equal(a, c) {
		t.Fatalf("secrets %x, %x (same prefix), %x (another)", a, b, c)
	}
}
