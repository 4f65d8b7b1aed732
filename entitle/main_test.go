package entitle

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// clock is a Clock that moves only when told to.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// billing is a real HTTP billing service: GET /orgs/{value} answers the
// value's entry from plans (404 when it has none) after delay, and counts
// the requests per value.
type billing struct {
	srv   *httptest.Server
	mu    sync.Mutex
	plans map[string]string
	delay time.Duration
	calls map[string]int
	total atomic.Int64
}

func newBilling(t testing.TB, plans map[string]string) *billing {
	t.Helper()
	b := &billing{plans: plans, calls: map[string]int{}}
	b.srv = httptest.NewServer(http.HandlerFunc(b.serve))
	t.Cleanup(b.srv.Close)
	return b
}

func (b *billing) serve(w http.ResponseWriter, r *http.Request) {
	value := strings.TrimPrefix(r.URL.Path, "/orgs/")
	b.mu.Lock()
	b.calls[value]++
	plan, ok := b.plans[value]
	delay := b.delay
	b.mu.Unlock()
	b.total.Add(1)
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
	}
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"plan": plan, "org": value})
}

func (b *billing) set(value, plan string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.plans[value] = plan
}

func (b *billing) setDelay(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.delay = d
}

func (b *billing) callsOf(value string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.calls[value]
}

// source is an HTTP source asking b.
func (b *billing) source(t testing.TB) *HTTP {
	t.Helper()
	src, err := NewHTTP(b.srv.URL+"/orgs/{value}", HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return src
}

// settle waits for c's lookups in flight to end. Only the test's own
// goroutine may be calling c meanwhile.
func settle(c *Cache) { c.wg.Wait() }

// eventually fails t unless cond holds within 5s, checking every
// millisecond: for work that runs in a goroutine of its own.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s, still not %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// funcSource is a Source made of a function, for what a real source
// cannot be made to do (panic).
type funcSource struct {
	lookup func(ctx context.Context, value string) (Entitlement, bool, error)
	closed atomic.Bool
}

func (s *funcSource) Lookup(ctx context.Context, value string) (Entitlement, bool, error) {
	return s.lookup(ctx, value)
}

func (s *funcSource) Close() error {
	s.closed.Store(true)
	return nil
}
