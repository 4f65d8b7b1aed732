package alert

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// answer is one scripted reply of a hook: a status and a Retry-After.
type answer struct {
	status     int
	retryAfter string
}

type recorded struct {
	method string
	header http.Header
	body   []byte
}

// hook is a webhook receiver that answers from a script (its last answer
// repeating) and records what it was sent. With a gate, each request
// waits for the gate to close or for its client to give up.
type hook struct {
	srv     *httptest.Server
	arrived chan struct{} // one signal per request, when it arrives

	mu      sync.Mutex
	answers []answer
	reqs    []recorded
}

func newHook(t *testing.T, gate chan struct{}, answers ...answer) *hook {
	t.Helper()
	h := &hook{answers: answers, arrived: make(chan struct{}, 1000)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		h.mu.Lock()
		h.reqs = append(h.reqs, recorded{r.Method, r.Header.Clone(), body})
		a := h.answers[0]
		if len(h.answers) > 1 {
			h.answers = h.answers[1:]
		}
		h.mu.Unlock()
		h.arrived <- struct{}{}
		if gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		if a.status >= 300 && a.status < 400 {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, "ignored body")
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hook) requests() []recorded {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]recorded(nil), h.reqs...)
}

// probe records what a Sender reports and the waits it asks for; its
// sleep returns at once.
type probe struct {
	mu       sync.Mutex
	outcomes []string
	sleeps   []time.Duration
}

func (p *probe) onResult(o string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.outcomes = append(p.outcomes, o)
}

func (p *probe) sleep(ctx context.Context, d time.Duration) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sleeps = append(p.sleeps, d)
	return ctx.Err()
}

func (p *probe) results() ([]string, []time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.outcomes...), append([]time.Duration(nil), p.sleeps...)
}

// start returns a Sender for o, its probe wired in, closed at the test's end.
func start(t *testing.T, o Options) (*Sender, *probe) {
	t.Helper()
	p := &probe{}
	o.OnResult, o.Sleep = p.onResult, p.sleep
	s, err := New(o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s, p
}

// newEvent returns the event every test sends.
func newEvent() Event {
	return Event{
		Tree: "api", Tier: "user", Value: "fp:1a2b", Limit: "100 usd/month", Dimension: "usd",
		PeriodEnd: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC),
		Used:      80_000_000, Capacity: 100_000_000, Threshold: 80,
	}
}

func TestDelivery(t *testing.T) {
	event := newEvent()
	const base = time.Second
	tests := []struct {
		name     string
		answers  []answer
		outcome  string
		attempts int
		sleeps   []time.Duration // the least each wait may be; jitter adds up to 20%, Retry-After none
		exact    bool            // the waits are exactly sleeps (a Retry-After won)
	}{
		{"sent once on 200", []answer{{200, ""}}, Sent, 1, nil, false},
		{"any 2xx is sent", []answer{{204, ""}}, Sent, 1, nil, false},
		{"retried after 500", []answer{{500, ""}, {200, ""}}, Sent, 2, []time.Duration{base}, false},
		{"retried after 408", []answer{{408, ""}, {200, ""}}, Sent, 2, []time.Duration{base}, false},
		{"backoff doubles", []answer{{502, ""}, {502, ""}, {200, ""}}, Sent, 3, []time.Duration{base, 2 * base}, false},
		{"not retried on 400", []answer{{400, ""}}, Failed, 1, nil, false},
		{"not retried on 404", []answer{{404, ""}}, Failed, 1, nil, false},
		{"redirect not followed", []answer{{302, ""}}, Failed, 1, nil, false},
		{"fails after all retries", []answer{{503, ""}}, Failed, 4, []time.Duration{base, 2 * base, 4 * base}, false},
		{"Retry-After honoured on 429", []answer{{429, "7"}, {200, ""}}, Sent, 2, []time.Duration{7 * time.Second}, true},
		{"Retry-After honoured on 503", []answer{{503, "7"}, {200, ""}}, Sent, 2, []time.Duration{7 * time.Second}, true},
		{"Retry-After capped", []answer{{429, "3600"}, {200, ""}}, Sent, 2, []time.Duration{time.Minute}, true},
		{"Retry-After shorter than backoff", []answer{{429, "0"}, {200, ""}}, Sent, 2, []time.Duration{base}, false},
		{"Retry-After as a date ignored", []answer{{429, "Wed, 21 Oct 2015 07:28:00 GMT"}, {200, ""}}, Sent, 2, []time.Duration{base}, false},
		{"Retry-After ignored on 500", []answer{{500, "7"}, {200, ""}}, Sent, 2, []time.Duration{base}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHook(t, nil, tt.answers...)
			s, p := start(t, Options{URL: h.srv.URL + "/hook", Backoff: base})
			if !s.Send(event) {
				t.Fatal("Send refused the event")
			}
			if err := s.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			outcomes, sleeps := p.results()
			if len(outcomes) != 1 || outcomes[0] != tt.outcome {
				t.Errorf("outcomes %v, want [%s]", outcomes, tt.outcome)
			}
			if n := len(h.requests()); n != tt.attempts {
				t.Errorf("%d attempts, want %d", n, tt.attempts)
			}
			if len(sleeps) != len(tt.sleeps) {
				t.Fatalf("waits %v, want %d of them", sleeps, len(tt.sleeps))
			}
			for i, d := range sleeps {
				low, high := tt.sleeps[i], tt.sleeps[i]+tt.sleeps[i]/5
				if tt.exact {
					high = low
				}
				if d < low || d > high {
					t.Errorf("wait %d: %v, want within [%v, %v]", i, d, low, high)
				}
			}
		})
	}
}

func TestRequest(t *testing.T) {
	event := newEvent()
	h := newHook(t, nil, answer{200, ""})
	s, _ := start(t, Options{URL: h.srv.URL + "/hook", Header: http.Header{"Authorization": {"Bearer sekrit"}}})
	s.Send(event)
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	reqs := h.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1", len(reqs))
	}
	r := reqs[0]
	for k, want := range map[string]string{
		"Content-Type":  "application/json",
		"User-Agent":    "cascade-alert",
		"Authorization": "Bearer sekrit",
	} {
		if got := r.header.Get(k); got != want {
			t.Errorf("%s: %q, want %q", k, got, want)
		}
	}
	if r.method != http.MethodPost {
		t.Errorf("method %s, want POST", r.method)
	}
	var got Event
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatalf("body %s: %v", r.body, err)
	}
	if !got.PeriodEnd.Equal(event.PeriodEnd) {
		t.Errorf("period_end %v, want %v", got.PeriodEnd, event.PeriodEnd)
	}
	got.PeriodEnd = event.PeriodEnd
	if got != event {
		t.Errorf("body %+v, want %+v", got, event)
	}
	var fields map[string]any
	_ = json.Unmarshal(r.body, &fields)
	for _, k := range []string{"tree", "tier", "value", "limit", "dimension", "period_end", "used", "capacity", "threshold"} {
		if _, ok := fields[k]; !ok {
			t.Errorf("body lacks %q: %s", k, r.body)
		}
	}
}

func TestTransportErrorRetried(t *testing.T) {
	event := newEvent()
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close() // nothing listens there now
	s, p := start(t, Options{URL: url, Retries: 2, Backoff: time.Millisecond})
	s.Send(event)
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	outcomes, sleeps := p.results()
	if len(outcomes) != 1 || outcomes[0] != Failed || len(sleeps) != 2 {
		t.Errorf("outcomes %v after waits %v, want [failed] after 2", outcomes, sleeps)
	}
}

func TestQueueFullDrops(t *testing.T) {
	event := newEvent()
	gate := make(chan struct{})
	h := newHook(t, gate, answer{200, ""})
	s, p := start(t, Options{URL: h.srv.URL, QueueSize: 1})
	if !s.Send(event) {
		t.Fatal("first event refused")
	}
	<-h.arrived // the worker holds the first; the queue is empty
	if !s.Send(event) {
		t.Fatal("second event refused with room in the queue")
	}
	if s.Send(event) {
		t.Fatal("third event taken by a full queue")
	}
	if outcomes, _ := p.results(); len(outcomes) != 1 || outcomes[0] != Dropped {
		t.Fatalf("outcomes %v, want [dropped]", outcomes)
	}
	close(gate)
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if outcomes, _ := p.results(); fmt.Sprint(outcomes) != "[dropped sent sent]" {
		t.Errorf("outcomes %v, want [dropped sent sent]", outcomes)
	}
}

func TestCloseDrains(t *testing.T) {
	event := newEvent()
	gate := make(chan struct{})
	h := newHook(t, gate, answer{200, ""})
	s, p := start(t, Options{URL: h.srv.URL})
	const n = 5
	for range n {
		if !s.Send(event) {
			t.Fatal("event refused")
		}
	}
	<-h.arrived
	closed := make(chan error)
	go func() { closed <- s.Close(context.Background()) }()
	close(gate)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := len(h.requests()); got != n {
		t.Errorf("%d posted, want %d", got, n)
	}
	if outcomes, _ := p.results(); fmt.Sprint(outcomes) != "[sent sent sent sent sent]" {
		t.Errorf("outcomes %v, want 5 sent", outcomes)
	}
	if s.Send(event) {
		t.Error("a closed sender took an event")
	}
	if outcomes, _ := p.results(); outcomes[len(outcomes)-1] != Dropped {
		t.Errorf("outcomes %v, want the last dropped", outcomes)
	}
	if err := s.Close(context.Background()); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseExpiredAbandons(t *testing.T) {
	event := newEvent()
	gate := make(chan struct{}) // never opened: requests wait for their client to give up
	h := newHook(t, gate, answer{200, ""})
	core, logs := observer.New(zapcore.DebugLevel)
	s, p := start(t, Options{URL: h.srv.URL, Logger: zap.New(core)})
	for range 3 {
		s.Send(event)
	}
	<-h.arrived // one in flight, two queued
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := s.Close(ctx)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Close: %v, want context.Canceled", err)
	}
	if outcomes, _ := p.results(); fmt.Sprint(outcomes) != "[dropped dropped dropped]" {
		t.Errorf("outcomes %v, want 3 dropped", outcomes)
	}
	if n := logs.FilterMessage("alert: webhook failed").Len(); n != 0 {
		t.Errorf("%d failures logged for abandoned events", n)
	}
	if all := logs.FilterMessage("alert: events abandoned at close").All(); len(all) != 1 || all[0].ContextMap()["events"] != int64(3) {
		t.Errorf("abandon logs %v, want one of 3 events", all)
	}
}

func TestNoGoroutineLeak(t *testing.T) {
	event := newEvent()
	h := newHook(t, nil, answer{200, ""})
	p := &probe{}
	s, err := New(Options{URL: h.srv.URL, OnResult: p.onResult, Sleep: p.sleep})
	if err != nil {
		t.Fatal(err)
	}
	s.Send(event)
	if err := s.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-s.done:
	default:
		t.Fatal("worker still running after Close")
	}
	// The worker has closed done; let it finish returning, then look for it.
	for i := 0; ; i++ {
		buf := make([]byte, 1<<20)
		stacks := string(buf[:runtime.Stack(buf, true)])
		if !strings.Contains(stacks, "alert.(*Sender).run") {
			break
		}
		if i == 1000 {
			t.Fatalf("worker goroutine left after Close:\n%s", stacks)
		}
		runtime.Gosched()
	}
}

func TestConcurrentSendAndClose(t *testing.T) {
	event := newEvent()
	h := newHook(t, nil, answer{200, ""})
	var mu sync.Mutex
	counts := map[string]int{}
	s, err := New(Options{URL: h.srv.URL, QueueSize: 16, OnResult: func(o string) {
		mu.Lock()
		counts[o]++
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	const senders, each = 4, 50
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() {
			for range each {
				s.Send(event)
			}
		})
	}
	wg.Go(func() { _ = s.Close(context.Background()) })
	wg.Wait()
	_ = s.Close(context.Background()) // returns once the worker has
	mu.Lock()
	defer mu.Unlock()
	if total := counts[Sent] + counts[Dropped] + counts[Failed]; total != senders*each {
		t.Errorf("outcomes %v: %d, want one per event (%d)", counts, total, senders*each)
	}
	if counts[Sent] != len(h.requests()) {
		t.Errorf("%d sent, %d posted", counts[Sent], len(h.requests()))
	}
}

func TestLogsHideSecrets(t *testing.T) {
	event := newEvent()
	tests := []struct {
		name string
		url  func(h *hook) string
	}{
		{"4xx answer", func(h *hook) string { return h.srv.URL }},
		{"transport error", func(h *hook) string { u := h.srv.URL; h.srv.Close(); return u }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHook(t, nil, answer{401, ""})
			base := tt.url(h)
			secret := strings.Replace(base, "http://", "http://alice:pw-secret@", 1) + "/hook?token=tok-secret"
			core, logs := observer.New(zapcore.DebugLevel)
			s, _ := start(t, Options{
				URL: secret, Retries: 1, Logger: zap.New(core),
				Header: http.Header{"Authorization": {"Bearer hdr-secret"}},
			})
			s.Send(event)
			if err := s.Close(context.Background()); err != nil {
				t.Fatalf("Close: %v", err)
			}
			all := logs.All()
			if len(all) != 1 || all[0].Level != zapcore.WarnLevel {
				t.Fatalf("logs %v, want one WARN", all)
			}
			m := all[0].ContextMap()
			if m["webhook"] != base || m["tree"] != "api" || m["tier"] != "user" || m["threshold"] != int64(80) || m["error"] == nil {
				t.Errorf("fields %v", m)
			}
			line := all[0].Message + fmt.Sprint(m)
			for _, leak := range []string{"alice", "pw-secret", "token", "tok-secret", "hdr-secret", "/hook"} {
				if strings.Contains(line, leak) {
					t.Errorf("log shows %q: %s", leak, line)
				}
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name string
		o    Options
		ok   bool
	}{
		{"http", Options{URL: "http://example.com/hook"}, true},
		{"https with port", Options{URL: "https://example.com:8443/hook?k=v"}, true},
		{"empty", Options{}, false},
		{"no scheme", Options{URL: "example.com/hook"}, false},
		{"other scheme", Options{URL: "ftp://example.com/hook"}, false},
		{"opaque", Options{URL: "mailto:ops@example.com"}, false},
		{"no host", Options{URL: "http:///hook"}, false},
		{"does not parse", Options{URL: "http://u:secret@[::1/hook"}, false},
		{"control character", Options{URL: "http://example.com/\x7f"}, false},
		{"negative timeout", Options{URL: "http://example.com", Timeout: -1}, false},
		{"negative retries", Options{URL: "http://example.com", Retries: -1}, false},
		{"negative backoff", Options{URL: "http://example.com", Backoff: -time.Second}, false},
		{"negative queue", Options{URL: "http://example.com", QueueSize: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := New(tt.o)
			if (err == nil) != tt.ok {
				t.Fatalf("New(%+v): %v, want ok %v", tt.o, err, tt.ok)
			}
			if s != nil {
				_ = s.Close(context.Background())
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("error shows the URL's secret: %v", err)
			}
		})
	}
}

func TestRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0}, {"0", 0}, {"-5", 0}, {"soon", 0}, {"1.5", 0},
		{"1", time.Second}, {"59", 59 * time.Second}, {"60", time.Minute}, {"86400", time.Minute},
		{strconv.FormatInt(1<<62, 10), time.Minute},
	} {
		if got := retryAfter(tt.in); got != tt.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
