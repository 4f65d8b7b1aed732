package adaptive

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// exporterPage is an exporter's page of the size a PgBouncer or PostgreSQL
// exporter serves: 40 gauge families of 12 series with 3 labels each.
func exporterPage() string {
	var b strings.Builder
	for f := range 40 {
		fmt.Fprintf(&b, "# HELP pg_metric_%d Some gauge.\n# TYPE pg_metric_%d gauge\n", f, f)
		for s := range 12 {
			fmt.Fprintf(&b, "pg_metric_%d{database=\"db%d\",user=\"app\",pool_mode=\"transaction\"} %d\n", f, s, f*s)
		}
	}
	return b.String()
}

// BenchmarkSignalRead is the cost of one read of a remote signal, on its
// own goroutine once per interval (5s by default), never on the request
// path: "parse" is the evaluation of a fetched body, "loopback" the whole
// read from a server on this machine (the HTTP round trip included).
func BenchmarkSignalRead(b *testing.B) {
	page := exporterPage()
	health := `{"status":"ok","db":{"pool":{"in_use":45,"size":50,"waiting":0}},"queues":[{"name":"default","depth":12}],"version":"1.2.3"}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			w.Write([]byte(page))
			return
		}
		w.Write([]byte(health))
	}))
	defer srv.Close()
	client := srv.Client()
	prom, err := newPrometheusProbe(client, &PrometheusSignal{URL: srv.URL + "/metrics",
		Metric: `pg_metric_20{database="db7",user="app"}`, DivideBy: `pg_metric_21{database="db7"}`})
	if err != nil {
		b.Fatal(err)
	}
	hp, err := newHTTPProbe(client, &HTTPSignal{URL: srv.URL + "/health", Field: "db.pool.in_use"})
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("exporter page: %d bytes, 480 series", len(page))
	for _, bc := range []struct {
		name string
		read func() (float64, error)
	}{
		{"prometheus/parse", func() (float64, error) { return prom.eval([]byte(page)) }},
		{"prometheus/loopback", func() (float64, error) { return prom.Probe(context.Background()) }},
		{"http/parse", func() (float64, error) { return hp.eval([]byte(health)) }},
		{"http/loopback", func() (float64, error) { return hp.Probe(context.Background()) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				if _, err := bc.read(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSampleSignals is what external signals add to the sampler's
// work per interval: taking the latest readings (remote), summing the
// window (response header), reading the count (in flight).
func BenchmarkSampleSignals(b *testing.B) {
	for _, n := range []int{0, 1, 4} {
		b.Run(fmt.Sprintf("signals=%d", n), func(b *testing.B) {
			kinds := []SignalConfig{
				poolSignal(OnErrorIgnore),
				{Name: "queue", HTTP: &HTTPSignal{URL: "http://w/h", Field: "q"}, Warn: 10, Critical: 20, OnError: OnErrorIgnore},
				{Name: "hdr", ResponseHeader: "X-Q", Warn: 10, Critical: 20, OnError: OnErrorIgnore},
				{Name: "inflight", InFlight: 100, Warn: 80, Critical: 100},
			}
			probes := map[string]Probe{"pg_pool": &pool{v: 0.5}, "queue": &pool{v: 5}}
			c, err := New(Config{Signals: kinds[:n]}, Options{Probes: probes, Now: func() time.Time { return epoch },
				CPU: SourceFunc(func(time.Time) (float64, error) { return 50, nil })})
			if err != nil {
				b.Fatal(err)
			}
			for _, x := range c.signals {
				if x.probe != nil {
					c.poll(x)
				}
			}
			for i := range 10_000 {
				c.Record(time.Duration(i)*time.Microsecond*37, 200)
				c.RecordHeaders(http.Header{"X-Q": {"7"}})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				c.Sample(epoch.Add(time.Duration(i%3) * time.Millisecond))
			}
		})
	}
}

// BenchmarkSignalHooks is the request path's cost of feeding the signals
// that need it, paid only when such a signal is configured.
func BenchmarkSignalHooks(b *testing.B) {
	c, err := New(Config{Signals: []SignalConfig{
		{Name: "hdr", ResponseHeader: "X-Pool-Usage", Warn: 0.7, Critical: 0.9, OnError: OnErrorIgnore},
		{Name: "inflight", InFlight: 100, Warn: 80, Critical: 100},
	}}, Options{CPU: SourceFunc(func(time.Time) (float64, error) { return 50, nil })})
	if err != nil {
		b.Fatal(err)
	}
	hdr := http.Header{"Content-Type": {"application/json"}, "X-Pool-Usage": {"0.42"}, "Date": {"x"}}
	b.Run("Begin+Done", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			c.Begin()
			c.Done()
		}
	})
	b.Run("RecordHeaders", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			c.RecordHeaders(hdr)
		}
	})
	b.Run("RecordHeaders/parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				c.RecordHeaders(hdr)
			}
		})
	})
}
