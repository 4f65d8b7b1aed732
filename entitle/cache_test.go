package entitle

import (
	"context"
	"fmt"
	"hash/maphash"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/caddy-cascade/cascade/hierarchy"
)

// get is c.Get of value with a background context, for plans.
func get(c *Cache, value string) (string, bool) {
	e, _, ok := c.Get(context.Background(), value)
	if e == nil {
		return "", ok
	}
	return e.Plan, ok
}

// wantStats fails t unless c's counters (but Entries) are want.
func wantStats(t *testing.T, c *Cache, want Stats) {
	t.Helper()
	got := c.Stats()
	got.Entries = 0
	if got != want {
		t.Errorf("stats %+v, want %+v", got, want)
	}
}

func TestCacheServesStaleWhileTheSourceIsDown(t *testing.T) {
	bill := newBilling(t, map[string]string{"acme": "pro"})
	clk := newClock()
	c := NewCache(bill.source(t), Options{TTL: time.Minute, Stale: 10 * time.Minute, Clock: clk.Now})
	defer c.Close()

	if plan, ok := get(c, "acme"); !ok || plan != "pro" {
		t.Fatalf("first Get: %q, %v", plan, ok)
	}
	bill.srv.Close() // the billing service goes down

	steps := []struct {
		name    string
		advance time.Duration
		wantOK  bool
	}{
		{"fresh: served, and a background refresh fails", 50 * time.Second, true},
		{"past TTL after the failed refresh: the stale answer", 20 * time.Second, true},
		{"still within Stale", 9 * time.Minute, true},
		{"past Stale: none", time.Minute, false},
	}
	for _, s := range steps {
		clk.Add(s.advance)
		if plan, ok := get(c, "acme"); ok != s.wantOK || ok && plan != "pro" {
			t.Errorf("%s: %q, %v", s.name, plan, ok)
		}
		settle(c)
	}
	st := c.Stats()
	if st.Hits != 1 || st.Stale != 2 || st.Misses != 2 || st.Failures < 2 || st.Lookups != st.Failures+1 {
		t.Errorf("stats %+v, want 1 hit, 2 stale, 2 misses (the first Get and the last), every lookup but the first failed", st)
	}
}

func TestCacheWaitsAtMostTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	tests := []struct {
		name     string
		delay    time.Duration // the service's
		ctx      time.Duration // the request's deadline; 0 for none
		wantWait time.Duration
	}{
		{"a slow source", timeout * 3 / 2, 0, timeout},
		{"a request's deadline first", timeout * 3 / 2, timeout / 4, timeout / 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bill := newBilling(t, map[string]string{"acme": "pro"})
			bill.setDelay(tt.delay)
			c := NewCache(bill.source(t), Options{Timeout: timeout})
			defer c.Close()
			ctx := context.Background()
			if tt.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.ctx)
				defer cancel()
			}

			start := time.Now()
			_, _, ok := c.Get(ctx, "acme")
			waited := time.Since(start)
			if ok || waited < tt.wantWait || waited > tt.wantWait+100*time.Millisecond {
				t.Fatalf("Get: ok %v after %v, want false after about %v", ok, waited, tt.wantWait)
			}
			settle(c) // the slow lookup completes in the background
			if plan, ok := get(c, "acme"); !ok || plan != "pro" {
				t.Fatalf("Get once the lookup completed: %q, %v", plan, ok)
			}
			wantStats(t, c, Stats{Lookups: 1, Hits: 1, Misses: 1, Timeouts: 1})
			if n := bill.callsOf("acme"); n != 1 {
				t.Errorf("%d calls to the service, want 1", n)
			}
		})
	}
}

func TestCacheLooksAValueUpOnceForConcurrentGets(t *testing.T) {
	bill := newBilling(t, map[string]string{"acme": "pro"})
	bill.setDelay(50 * time.Millisecond) // so that every Get finds the lookup in flight
	c := NewCache(bill.source(t), Options{Timeout: 10 * time.Second})
	defer c.Close()

	const n = 1000
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			<-start
			if plan, ok := get(c, "acme"); !ok || plan != "pro" {
				errs <- fmt.Sprintf("%q, %v", plan, ok)
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Errorf("a Get: %s", e)
	}
	if calls := bill.callsOf("acme"); calls != 1 {
		t.Errorf("%d calls to the service for %d concurrent Gets, want 1", calls, n)
	}
	if st := c.Stats(); st.Lookups != 1 || st.Hits+st.Misses != n {
		t.Errorf("stats %+v, want 1 lookup and %d Gets", st, n)
	}
}

func TestCacheRefreshesBusyValuesInTheBackground(t *testing.T) {
	bill := newBilling(t, map[string]string{"acme": "pro"})
	clk := newClock()
	c := NewCache(bill.source(t), Options{TTL: time.Minute, Clock: clk.Now})
	defer c.Close()

	get(c, "acme")
	settle(c)
	// A Get every 10s for 10 minutes: each is a hit, and the first past
	// 80% of the answer's TTL (48s) refreshes it, so one lookup every
	// 50s.
	for i := 1; i <= 60; i++ {
		clk.Add(10 * time.Second)
		if i == 32 {
			bill.set("acme", "enterprise")
		}
		want := "pro"
		if i > 35 { // the first refresh after the upgrade is the Get at i=35's
			want = "enterprise"
		}
		if plan, ok := get(c, "acme"); !ok || plan != want {
			t.Fatalf("after %ds: %q, %v; want %q", i*10, plan, ok, want)
		}
		settle(c)
	}
	wantStats(t, c, Stats{Lookups: 13, Hits: 60, Misses: 1})
	if calls := bill.callsOf("acme"); calls != 13 {
		t.Errorf("%d calls to the service, want 13 (1 + one per 50s)", calls)
	}
}

func TestCacheKeepsNotFoundForNegativeTTL(t *testing.T) {
	bill := newBilling(t, map[string]string{})
	clk := newClock()
	c := NewCache(bill.source(t), Options{TTL: time.Hour, NegativeTTL: 30 * time.Second, Clock: clk.Now})
	defer c.Close()

	steps := []struct {
		advance   time.Duration
		wantCalls int
	}{
		{0, 1},
		{10 * time.Second, 1},
		{10 * time.Second, 1},
		{11 * time.Second, 2}, // past NegativeTTL
		{time.Second, 2},
	}
	for i, s := range steps {
		clk.Add(s.advance)
		if _, ok := get(c, "ghost"); ok {
			t.Errorf("step %d: ok for a value the source does not know", i)
		}
		settle(c)
		if calls := bill.callsOf("ghost"); calls != s.wantCalls {
			t.Errorf("step %d: %d calls, want %d", i, calls, s.wantCalls)
		}
	}
}

func TestCacheRetriesAFailedValueAfterAWhile(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	src, err := NewHTTP(srv.URL+"/orgs/{value}", HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	c := NewCache(src, Options{TTL: time.Minute, Clock: clk.Now}) // a retry every 6s at most
	defer c.Close()

	for i, s := range []struct {
		advance   time.Duration
		wantCalls int64
	}{{0, 1}, {time.Second, 1}, {4 * time.Second, 1}, {2 * time.Second, 2}, {time.Second, 2}} {
		clk.Add(s.advance)
		if _, ok := get(c, "acme"); ok {
			t.Errorf("step %d: ok from a failing source", i)
		}
		settle(c)
		if st := c.Stats(); calls.Load() != s.wantCalls || st.Failures != uint64(s.wantCalls) {
			t.Errorf("step %d: %d calls, %+v; want %d failed lookups", i, calls.Load(), st, s.wantCalls)
		}
	}
}

func TestCacheInvalidate(t *testing.T) {
	bill := newBilling(t, map[string]string{"acme": "pro"})
	c := NewCache(bill.source(t), Options{})
	defer c.Close()

	get(c, "acme")
	bill.set("acme", "enterprise")
	if plan, _ := get(c, "acme"); plan != "pro" {
		t.Fatalf("before Invalidate: %q, want the cached pro", plan)
	}
	c.Invalidate("acme")
	if plan, _ := get(c, "acme"); plan != "enterprise" {
		t.Fatalf("after Invalidate: %q, want enterprise", plan)
	}
	if calls := bill.callsOf("acme"); calls != 2 {
		t.Errorf("%d calls, want 2", calls)
	}
}

// twoOfThree is a cache of at most two entries, on a test clock, in front
// of a file of three values (a, b and c, on plans A, B and C).
func twoOfThree(t *testing.T) (*Cache, *clock) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "plans.json")
	writeFile(t, path, `{"a": {"plan": "A"}, "b": {"plan": "B"}, "c": {"plan": "C"}}`)
	f, err := NewFile(path, FileOptions{Poll: -1})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	c := NewCache(f, Options{MaxEntries: 2, Clock: clk.Now})
	t.Cleanup(func() { c.Close() })
	return c, clk
}

func TestCacheDropsTheLeastRecentlyUsed(t *testing.T) {
	c, clk := twoOfThree(t)

	for _, s := range []struct {
		value       string
		wantLookups uint64
	}{
		{"a", 1}, {"b", 2}, {"a", 2}, // a used after b
		{"c", 3}, // drops b
		{"a", 3}, {"c", 3},
		{"b", 4}, // drops a
		{"a", 5},
	} {
		clk.Add(time.Second)
		if plan, ok := get(c, s.value); !ok || plan != strings.ToUpper(s.value) {
			t.Fatalf("%s: %q, %v", s.value, plan, ok)
		}
		st := c.Stats()
		if st.Lookups != s.wantLookups || st.Entries > 2 {
			t.Fatalf("after %s: %+v, want %d lookups and at most 2 entries", s.value, st, s.wantLookups)
		}
	}
}

func TestCacheClose(t *testing.T) {
	bill := newBilling(t, map[string]string{"acme": "pro"})
	bill.setDelay(time.Minute) // never answers in time
	src := bill.source(t)
	closed := &funcSource{lookup: src.Lookup}
	c := NewCache(closed, Options{Timeout: 30 * time.Second})

	got := make(chan bool)
	go func() { _, ok := get(c, "acme"); got <- ok }()
	eventually(t, "the lookup in flight", func() bool { return bill.total.Load() == 1 })
	start := time.Now()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if ok := <-got; ok {
		t.Error("the waiting Get: ok")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v: the lookup was not cancelled", d)
	}
	if !closed.closed.Load() {
		t.Error("the source was not closed")
	}
	if _, ok := get(c, "initech"); ok || c.Stats().Lookups != 1 {
		t.Errorf("a Get after Close: ok %v, %+v; want no lookup", ok, c.Stats())
	}
	if err := c.Close(); err != nil {
		t.Errorf("a second Close: %v", err)
	}
}

func TestCacheSurvivesAPanickingSource(t *testing.T) {
	c := NewCache(&funcSource{lookup: func(context.Context, string) (Entitlement, bool, error) { panic("boom") }}, Options{})
	defer c.Close()
	if _, ok := get(c, "acme"); ok {
		t.Error("ok")
	}
	if st := c.Stats(); st.Failures != 1 {
		t.Errorf("%+v, want 1 failure", st)
	}
}

func TestCacheEmptyValue(t *testing.T) {
	c := NewCache(&funcSource{lookup: func(context.Context, string) (Entitlement, bool, error) {
		t.Error("an empty value was looked up")
		return Entitlement{}, false, nil
	}}, Options{})
	defer c.Close()
	if _, ok := get(c, ""); ok {
		t.Error("ok")
	}
}

func TestNewCacheShards(t *testing.T) {
	tests := []struct {
		max, shards, perShard int
	}{
		{0, 64, DefaultMaxEntries / 64},
		{1, 1, 1},
		{511, 1, 511},
		{512, 2, 256},
		{5000, 16, 312},
	}
	for _, tt := range tests {
		c := NewCache(&funcSource{}, Options{MaxEntries: tt.max})
		if len(c.shards) != tt.shards || c.perShard != tt.perShard {
			t.Errorf("MaxEntries %d: %d shards of %d, want %d of %d", tt.max, len(c.shards), c.perShard, tt.shards, tt.perShard)
		}
		c.Close()
	}
}

// hitCache is a cache with values v0…v999 in memory.
func hitCache(b testing.TB) (*Cache, []string) {
	src := &funcSource{lookup: func(_ context.Context, value string) (Entitlement, bool, error) {
		return Entitlement{Plan: "pro", Fields: map[string]string{"plan": "pro", "org": value}}, true, nil
	}}
	c := NewCache(src, Options{})
	values := make([]string, 1000)
	for i := range values {
		values[i] = fmt.Sprintf("org-%d", i)
		if _, _, ok := c.Get(context.Background(), values[i]); !ok {
			b.Fatal("not cached")
		}
	}
	return c, values
}

func BenchmarkCacheGetHit(b *testing.B) {
	c, values := hitCache(b)
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, _, ok := c.Get(ctx, values[i%len(values)]); !ok {
			b.Fatal("miss")
		}
		i++
	}
}

func BenchmarkCacheGetHitParallel(b *testing.B) {
	c, values := hitCache(b)
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, _, ok := c.Get(ctx, values[i%len(values)]); !ok {
				b.Fatal("miss")
			}
			i++
		}
	})
}

// TestCacheRecentUses: a value read only through the lock-free recent
// answers still counts as used, so the least recently used one is dropped
// rather than the busiest.
func TestCacheRecentUses(t *testing.T) {
	c, clk := twoOfThree(t)
	for _, v := range []string{"a", "a", "b", "b"} { // looked up, then put among the recent answers
		clk.Add(time.Second)
		get(c, v)
	}
	for range 3 { // a, from the recent answers only
		clk.Add(time.Second)
		if plan, ok := get(c, "a"); !ok || plan != "A" {
			t.Fatalf("a: %q, %v", plan, ok)
		}
	}
	clk.Add(time.Second)
	get(c, "c") // drops b, used least lately
	lookups := c.Stats().Lookups
	if plan, ok := get(c, "a"); !ok || plan != "A" || c.Stats().Lookups != lookups {
		t.Fatalf("a after c: %q, %v, %d lookups after %d: a was dropped", plan, ok, c.Stats().Lookups, lookups)
	}
}

// TestCacheRecentValues: values that share a slot of the recent answers,
// and values too long to be kept inline, each get their own answer.
func TestCacheRecentValues(t *testing.T) {
	plans := map[string]string{}
	for i := range 8 {
		plans[fmt.Sprintf("org-%d", i)] = fmt.Sprintf("P%d", i)
	}
	for _, n := range []int{shortValue - 1, shortValue, shortValue + 1, 300} {
		plans[strings.Repeat("x", n)] = fmt.Sprintf("L%d", n)
		plans[strings.Repeat("x", n-1)+"y"] = fmt.Sprintf("Y%d", n)
	}
	src := &funcSource{lookup: func(_ context.Context, v string) (Entitlement, bool, error) {
		p, ok := plans[v]
		return Entitlement{Plan: p}, ok, nil
	}}
	c := NewCache(src, Options{MaxEntries: 64, Clock: newClock().Now}) // 32 pairs: 16 values, some sharing one
	defer c.Close()
	for round := range 4 {
		for v, want := range plans {
			if plan, ok := get(c, v); !ok || plan != want {
				t.Fatalf("round %d, %.12s… (%d bytes): %q, %v; want %q", round, v, len(v), plan, ok, want)
			}
		}
	}
	if st := c.Stats(); st.Lookups != uint64(len(plans)) {
		t.Fatalf("%d lookups of %d values", st.Lookups, len(plans))
	}
}

// TestRecentPair: two values that share a pair of the recent answers both
// stay in it; a third takes the second way, or the first when that one is
// due for a refresh; a drop takes out only its own value's answer.
func TestRecentPair(t *testing.T) {
	a := newAnswer("a", Entitlement{}, true, 10, 20)
	b := newAnswer("b", Entitlement{}, true, 10, 20)
	c := newAnswer("c", Entitlement{}, true, 10, 20)
	type step struct {
		op    string // put, drop
		value string
		ans   *answer
		now   int64
	}
	tests := []struct {
		name  string
		steps []step
		want  [2]*answer // the pair's ways after the steps
	}{
		{"into an empty pair", []step{{"put", "a", a, 0}}, [2]*answer{a, nil}},
		{"two share it", []step{{"put", "a", a, 0}, {"put", "b", b, 0}}, [2]*answer{a, b}},
		{"a third takes the second way", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"put", "c", c, 0}}, [2]*answer{a, c}},
		{"a third takes the first way when due", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"put", "c", c, 10}}, [2]*answer{c, b}},
		{"the same value again", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"put", "a", a, 0}}, [2]*answer{a, b}},
		{"a drop of the second", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"drop", "b", nil, 0}}, [2]*answer{a, nil}},
		{"a drop of the first", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"drop", "a", nil, 0}}, [2]*answer{nil, b}},
		{"a drop of a value not there", []step{{"put", "a", a, 0}, {"put", "b", b, 0}, {"drop", "c", nil, 0}}, [2]*answer{a, b}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p recentPair
			for _, s := range tt.steps {
				if s.op == "put" {
					p.put(s.value, s.ans, s.now)
				} else {
					p.drop(s.value)
				}
			}
			if got := [2]*answer{p[0].Load(), p[1].Load()}; got != tt.want {
				t.Fatalf("ways %v, want %v", got, tt.want)
			}
		})
	}
}

// TestRecentPairsShareShards: whatever MaxEntries, a value's pair of the
// recent answers tells its shard (the pairs' mask covers the shards'), as
// put and drop rely on.
func TestRecentPairsShareShards(t *testing.T) {
	src := &funcSource{lookup: func(context.Context, string) (Entitlement, bool, error) { return Entitlement{}, false, nil }}
	for max := 1; max <= 1<<24; max = max*2 + max%3 {
		c := NewCache(src, Options{MaxEntries: max, Clock: newClock().Now})
		if c.recentMask&c.mask != c.mask {
			t.Errorf("MaxEntries %d: %d pairs, %d shards: a pair may hold values of two shards", max, c.recentMask+1, c.mask+1)
		}
		c.Close()
	}
}

// TestCacheValuesOfEveryLength: a value is told from its neighbours whether
// its bytes lie in the answer's first line, its second, or outside it, and
// whether it is read from the map or from the recent answers.
func TestCacheValuesOfEveryLength(t *testing.T) {
	src := &funcSource{lookup: func(_ context.Context, value string) (Entitlement, bool, error) {
		if strings.HasPrefix(value, "unknown") {
			return Entitlement{}, false, nil
		}
		return Entitlement{Plan: "plan-" + value}, true, nil
	}}
	c := NewCache(src, Options{Clock: newClock().Now})
	defer c.Close()
	var values []string
	for _, n := range []int{1, hotValue - 1, hotValue, hotValue + 1, shortValue - 1, shortValue, shortValue + 1, 300} {
		v := strings.Repeat("x", n-1)
		values = append(values, v+"a", v+"b") // the same length, the last byte differs
	}
	for round := range 3 { // looked up, then from the map, then from recent
		for _, v := range values {
			if plan, ok := get(c, v); !ok || plan != "plan-"+v {
				t.Fatalf("round %d, value of %d bytes: %q, %v", round, len(v), plan, ok)
			}
		}
	}
	lookups := c.Stats().Lookups
	prefix := strings.Repeat("x", shortValue-1) // of cached values, one byte short of them
	if plan, ok := get(c, prefix); !ok || plan != "plan-"+prefix || c.Stats().Lookups != lookups+1 {
		t.Errorf("a prefix of cached values: %q, %v, %d lookups; want its own, looked up", plan, ok, c.Stats().Lookups-lookups)
	}
	e, m, ok := c.Get(context.Background(), "unknown-1")
	if ok || e != nil || m != nil {
		t.Errorf("Get of an unknown value: %v, %v, %v; want nothing", e, m, ok)
	}
	if st := c.Stats(); st.Hits != uint64(2*len(values)) { // the prefix's was a miss
		t.Errorf("%d hits, want %d", st.Hits, 2*len(values))
	}
}

func TestMemo(t *testing.T) {
	treeA, treeB := new(hierarchy.Tree), new(hierarchy.Tree)
	tier := new(hierarchy.Tier)
	own := &hierarchy.Override{Unlimited: true}
	tests := []struct {
		name    string
		set     []hierarchy.Entitlement // SetEntitled by treeA, in order
		read    *hierarchy.Tree
		want    hierarchy.Entitlement
		wantSet bool
	}{
		{"nothing set", nil, treeA, hierarchy.Entitlement{}, false},
		{"set", []hierarchy.Entitlement{{Indexed: true, Index: 2}}, treeA, hierarchy.Entitlement{Indexed: true, Index: 2}, true},
		{"another owner's", []hierarchy.Entitlement{{Indexed: true, Index: 2}}, treeB, hierarchy.Entitlement{}, false},
		{"the first set stays", []hierarchy.Entitlement{{Indexed: true, Index: 2}, {Indexed: true, Index: 3}}, treeA, hierarchy.Entitlement{Indexed: true, Index: 2}, true},
		{"own limits", []hierarchy.Entitlement{{Indexed: true, Index: 1, Tier: tier, Own: own}}, treeA, hierarchy.Entitlement{Indexed: true, Index: 1, Tier: tier, Own: own}, true},
		{"not indexed: not kept", []hierarchy.Entitlement{{Plan: "pro"}}, treeA, hierarchy.Entitlement{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m Memo
			for _, ent := range tt.set {
				m.SetEntitled(treeA, ent)
			}
			var got hierarchy.Entitlement
			if ok := m.Entitled(tt.read, &got); ok != tt.wantSet || got != tt.want {
				t.Errorf("Entitled: %+v, %v; want %+v, %v", got, ok, tt.want, tt.wantSet)
			}
		})
	}
}

// TestMemoRace: readers racing the writers see nothing or the one kept,
// never a mix (run with -race).
func TestMemoRace(t *testing.T) {
	tree := new(hierarchy.Tree)
	var m Memo
	var wg sync.WaitGroup
	seen := make([]int, 8)
	for i := range 8 {
		wg.Go(func() {
			m.SetEntitled(tree, hierarchy.Entitlement{Indexed: true, Index: i + 1})
			var ent hierarchy.Entitlement
			if m.Entitled(tree, &ent) {
				seen[i] = ent.Index
			}
		})
	}
	wg.Wait()
	var kept hierarchy.Entitlement
	if !m.Entitled(tree, &kept) {
		t.Fatal("nothing kept")
	}
	for i, s := range seen {
		if s != 0 && s != kept.Index {
			t.Errorf("reader %d saw %d, kept %d", i, s, kept.Index)
		}
	}
}

// TestAnswerLayout: on 64-bit platforms an answer is answerSize bytes (a
// size class Go allocates on a 256-byte boundary), and a short value's
// first hotValue bytes end its first cache line, with everything a fresh
// Get reads before them.
func TestAnswerLayout(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("the layout is laid out for 64-bit platforms")
	}
	var a answer
	if got := unsafe.Sizeof(a); got != answerSize {
		t.Errorf("an answer is %d bytes, want %d: mend its padding", got, answerSize)
	}
	if end := unsafe.Offsetof(a.short) + hotValue; end != 64 {
		t.Errorf("hotValue bytes of a short value end at byte %d, want 64", end)
	}
	for name, off := range map[string]uintptr{"refresh": unsafe.Offsetof(a.refresh), "used": unsafe.Offsetof(a.used),
		"memo": unsafe.Offsetof(a.memo) + unsafe.Sizeof(a.memo) - 1, "found": unsafe.Offsetof(a.found), "n": unsafe.Offsetof(a.n)} {
		if off >= 64 {
			t.Errorf("%s ends past the first cache line (byte %d)", name, off)
		}
	}
	c, values := hitCache(t) // a cache's answers, on the heap
	defer c.Close()
	for _, v := range values { // on 64-byte boundaries: the first line is one line
		h := maphash.String(c.seed, v)
		if p := uintptr(unsafe.Pointer(c.shards[h&c.mask].m[v].ans.Load())); p%64 != 0 {
			t.Fatalf("the answer of %q at %#x, not on a cache line's boundary", v, p)
		}
	}
}
