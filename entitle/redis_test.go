package entitle

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/internal/redistest"
)

// redisSource is a Redis source on the shared server, with keys of the
// test's own, and a client to write them.
func redisSource(t testing.TB) (*Redis, *redis.Client, string) {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr()})
	t.Cleanup(func() { client.Close() })
	prefix := t.Name() + ":org:"
	src, err := NewRedis(client, prefix+"{value}")
	if err != nil {
		t.Fatal(err)
	}
	return src, client, prefix
}

func TestRedis(t *testing.T) {
	src, client, prefix := redisSource(t)
	ctx := context.Background()
	if err := client.HSet(ctx, prefix+"acme", "plan", "enterprise", "limits", `[{"count":100,"per":"h","dimension":"tokens"}]`, "region", "eu").Err(); err != nil {
		t.Fatal(err)
	}
	client.HSet(ctx, prefix+"initech", "region", "us")
	client.HSet(ctx, prefix+"typo", "limits", `[{"cuont":1}]`)
	client.Set(ctx, prefix+"string", "x", 0)
	t.Cleanup(func() { client.Del(ctx, prefix+"acme", prefix+"initech", prefix+"typo", prefix+"string") })

	tests := []struct {
		value   string
		want    Entitlement
		found   bool
		wantErr string
	}{
		{value: "acme", found: true, want: Entitlement{
			Plan:   "enterprise",
			Limits: []*hierarchy.Limit{{Count: 100, Per: "h", Dimension: "tokens"}},
			Fields: map[string]string{"plan": "enterprise", "region": "eu"},
		}},
		{value: "initech", found: true, want: Entitlement{Fields: map[string]string{"region": "us"}}},
		{value: "nobody"},
		{value: "typo", wantErr: "field limits"},
		{value: "string", wantErr: "WRONGTYPE"},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, found, err := src.Lookup(ctx, tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), prefix+"{value}") || strings.Contains(err.Error(), prefix+tt.value) {
					t.Fatalf("error %v, want one naming the key's template (not the value: it may be a secret) and saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if found != tt.found || !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v (found %v), want %+v (found %v)", got, found, tt.want, tt.found)
			}
		})
	}
}

func TestNewRedisErrors(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	if _, err := NewRedis(client, "billing:org"); err == nil || !strings.Contains(err.Error(), "{value}") {
		t.Errorf("a template without {value}: error %v", err)
	}
	if _, err := NewRedis(nil, "billing:org:{value}"); err == nil {
		t.Error("no client: no error")
	}
}

func TestRedisUnreachable(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	defer client.Close()
	src, err := NewRedis(client, "billing:org:{value}")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := src.Lookup(context.Background(), "acme"); err == nil || !strings.Contains(err.Error(), "billing:org:{value}") || strings.Contains(err.Error(), "acme") {
		t.Errorf("error %v, want one naming the key's template, not the value", err)
	}
}

func BenchmarkRedisLookup(b *testing.B) {
	src, client, prefix := redisSource(b)
	ctx := context.Background()
	client.HSet(ctx, prefix+"acme", "plan", "enterprise", "limits", `[{"count":100,"per":"h"}]`)
	b.Cleanup(func() { client.Del(ctx, prefix+"acme") })
	b.ReportAllocs()
	for b.Loop() {
		if _, found, err := src.Lookup(ctx, "acme"); err != nil || !found {
			b.Fatal(found, err)
		}
	}
}
