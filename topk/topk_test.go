package topk

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

func TestExactWhenFewKeys(t *testing.T) {
	s := New(10)
	want := map[string]uint64{"a": 5, "b": 3, "c": 9}
	for k, n := range want {
		for i := uint64(0); i < n; i++ {
			s.Add(k, 1)
		}
	}
	top := s.Top(0)
	if len(top) != 3 || top[0].Key != "c" || top[1].Key != "a" || top[2].Key != "b" {
		t.Fatalf("top %+v", top)
	}
	for _, e := range top {
		if e.Count != want[e.Key] || e.Error != 0 {
			t.Errorf("%s: %d±%d, want %d", e.Key, e.Count, e.Error, want[e.Key])
		}
	}
	if s.Total() != 17 || len(s.Top(2)) != 2 {
		t.Fatalf("total %d", s.Total())
	}
	s.Reset()
	if s.Total() != 0 || len(s.Top(0)) != 0 {
		t.Fatal("Reset kept something")
	}
}

// TestHeavyHittersInAFlood: with far more distinct keys than counters,
// every key counted more than Total/k times is found, and every count
// brackets the truth.
func TestHeavyHittersInAFlood(t *testing.T) {
	const k = 50
	s := New(k)
	truth := map[string]uint64{}
	r := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(r, 1.3, 1, 100000)
	for i := 0; i < 200000; i++ {
		key := fmt.Sprintf("user-%d", zipf.Uint64())
		truth[key]++
		s.Add(key, 1)
	}
	in := map[string]Entry{}
	for _, e := range s.Top(0) {
		in[e.Key] = e
		if tr := truth[e.Key]; e.Count < tr || e.Count-e.Error > tr {
			t.Errorf("%s: count %d error %d, true %d", e.Key, e.Count, e.Error, tr)
		}
	}
	if len(in) != k {
		t.Fatalf("%d counters, want %d", len(in), k)
	}
	for key, n := range truth {
		if n > s.Total()/k {
			if _, ok := in[key]; !ok {
				t.Errorf("%s counted %d > N/k = %d times is missing", key, n, s.Total()/k)
			}
		}
	}
}

func TestConcurrentAdds(t *testing.T) {
	s := New(8)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				s.Add(fmt.Sprint(i%16), 1)
				s.Top(3)
			}
		}()
	}
	wg.Wait()
	if s.Total() != 8000 {
		t.Fatalf("total %d", s.Total())
	}
}

func BenchmarkAddHit(b *testing.B) {
	s := New(100)
	s.Add("hot", 1)
	for i := 0; i < b.N; i++ {
		s.Add("hot", 1)
	}
}

func BenchmarkAddMiss(b *testing.B) {
	s := New(100)
	keys := make([]string, 4096)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.Add(keys[i%len(keys)], 1)
	}
}
