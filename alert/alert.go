// Package alert posts budget-alert events to a webhook, off the request
// path: Send queues an event without blocking, and one worker goroutine
// per Sender posts each as JSON, retrying what may succeed later, until
// Close.
package alert

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Outcomes passed to Options.OnResult, one per event.
const (
	Sent    = "sent"    // a 2xx answer
	Failed  = "failed"  // every attempt failed, or one failed that is not retried
	Dropped = "dropped" // the queue was full, the sender closed, or Close abandoned it
)

const (
	defaultTimeout   = 5 * time.Second
	defaultRetries   = 3
	defaultBackoff   = time.Second
	defaultQueueSize = 1000
	maxRetryAfter    = 60 * time.Second
	maxDrain         = 64 << 10
	userAgent        = "cascade-alert"
)

// Event is one crossing of a threshold of a limit by a value, as posted.
type Event struct {
	Tree      string    `json:"tree"`
	Tier      string    `json:"tier"`
	Value     string    `json:"value"` // as logs show it (a fingerprint for a sensitive tier): the caller's to make safe
	Limit     string    `json:"limit"` // the limit as configured, e.g. "100 usd/month"
	Dimension string    `json:"dimension"`
	PeriodEnd time.Time `json:"period_end"` // when the limit's current period ends (its window or calendar period)
	Used      int64     `json:"used"`       // in the dimension's integer unit (micro-units for money)
	Capacity  int64     `json:"capacity"`
	Threshold int       `json:"threshold"` // percent, 1–100
}

// Options configure a Sender. Only URL is required; a zero value takes
// its default, a negative one is refused.
type Options struct {
	URL       string        // http or https; required
	Timeout   time.Duration // per attempt; default 5s
	Retries   int           // attempts after the first; default 3
	Backoff   time.Duration // first retry's wait, doubled each retry, with up to 20% jitter; default 1s
	QueueSize int           // events waiting at most; default 1000: a full queue drops the new event
	Header    http.Header   // added to each request (e.g. Authorization); never logged
	Client    *http.Client  // default: a client with Timeout and no redirects followed
	Logger    *zap.Logger   // default zap.NewNop()
	// Sleep waits d or until ctx is done (then returning its error); for
	// tests. Default: a timer honouring ctx.
	Sleep func(ctx context.Context, d time.Duration) error
	// OnResult, if set, is called once per event with Sent, Failed or
	// Dropped, from Send's caller or the worker: it must be safe for
	// concurrent use and must not block for long.
	OnResult func(outcome string)
}

// Sender queues events and posts them from one worker goroutine. It is
// safe for concurrent use; Close it to stop the worker.
type Sender struct {
	o         Options
	target    string // the URL's scheme and host: all of it that is logged
	ownClient bool

	mu     sync.Mutex // guards closed and sending on queue
	closed bool
	queue  chan Event

	ctx    context.Context // the worker's: cancelled to abandon the queue
	cancel context.CancelFunc
	done   chan struct{} // closed when the worker has returned
	once   sync.Once
}

// New validates o (the URL must parse with scheme http or https and a
// host; no option may be negative), fills in defaults and starts the
// worker.
func New(o Options) (*Sender, error) {
	u, err := url.Parse(o.URL)
	if err != nil {
		// url.Error repeats the URL, which may hold a token: keep only why.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("alert: webhook url does not parse: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("alert: webhook url scheme %q: want http or https", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("alert: webhook url has no host")
	}
	for _, c := range []struct {
		name string
		neg  bool
	}{
		{"timeout", o.Timeout < 0},
		{"retries", o.Retries < 0},
		{"backoff", o.Backoff < 0},
		{"queue size", o.QueueSize < 0},
	} {
		if c.neg {
			return nil, fmt.Errorf("alert: %s is negative", c.name)
		}
	}
	if o.Timeout == 0 {
		o.Timeout = defaultTimeout
	}
	if o.Retries == 0 {
		o.Retries = defaultRetries
	}
	if o.Backoff == 0 {
		o.Backoff = defaultBackoff
	}
	if o.QueueSize == 0 {
		o.QueueSize = defaultQueueSize
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Sleep == nil {
		o.Sleep = sleep
	}
	s := &Sender{
		target: (&url.URL{Scheme: u.Scheme, Host: u.Host}).String(),
		queue:  make(chan Event, o.QueueSize),
		done:   make(chan struct{}),
	}
	if o.Client == nil {
		o.Client = &http.Client{
			Timeout:       o.Timeout,
			Transport:     http.DefaultTransport.(*http.Transport).Clone(),
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
		s.ownClient = true
	}
	s.o = o
	s.ctx, s.cancel = context.WithCancel(context.Background())
	go s.run()
	return s, nil
}

// Send queues e without blocking. It returns false, and reports Dropped,
// when the queue is full or the sender is closed.
func (s *Sender) Send(e Event) bool {
	s.mu.Lock()
	ok := !s.closed
	if ok {
		select {
		case s.queue <- e:
		default:
			ok = false
		}
	}
	s.mu.Unlock()
	if !ok {
		s.result(Dropped)
	}
	return ok
}

// Close stops taking events and lets the worker finish the queue until
// ctx is done; then it abandons the rest, the event in flight included
// (each reported Dropped), and returns ctx's error. It returns once the
// worker has; calling it again is harmless.
func (s *Sender) Close(ctx context.Context) error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		close(s.queue)
		s.mu.Unlock()
	})
	var err error
	select {
	case <-s.done:
	case <-ctx.Done():
		s.cancel()
		<-s.done
		err = fmt.Errorf("alert: close abandoned the queue: %w", ctx.Err())
	}
	s.cancel()
	if s.ownClient {
		s.o.Client.CloseIdleConnections()
	}
	return err
}

func (s *Sender) run() {
	defer close(s.done)
	abandoned := 0
	for e := range s.queue {
		outcome := Dropped
		if s.ctx.Err() == nil {
			outcome = s.deliver(e)
		}
		if outcome == Dropped {
			abandoned++
		}
		s.result(outcome)
	}
	if abandoned > 0 {
		s.o.Logger.Warn("alert: events abandoned at close",
			zap.String("webhook", s.target), zap.Int("events", abandoned))
	}
}

func (s *Sender) result(outcome string) {
	if s.o.OnResult != nil {
		s.o.OnResult(outcome)
	}
}

// deliver posts e, retrying as the answers allow, and returns its outcome:
// Dropped when the worker's context ended it.
func (s *Sender) deliver(e Event) string {
	body, err := json.Marshal(e)
	if err != nil {
		s.warn(e, 0, fmt.Errorf("alert: encode event: %w", err))
		return Failed
	}
	for attempt := 0; ; attempt++ {
		retry, after, err := s.attempt(body)
		if err == nil {
			return Sent
		}
		if s.ctx.Err() != nil {
			return Dropped
		}
		if !retry || attempt >= s.o.Retries {
			s.warn(e, attempt+1, err)
			return Failed
		}
		d := backoff(s.o.Backoff, attempt)
		if after > d {
			d = after
		}
		if s.o.Sleep(s.ctx, d) != nil {
			return Dropped
		}
	}
}

// attempt posts body once. A nil error is a 2xx answer; otherwise retry
// tells whether another attempt may succeed, and after is the wait a
// Retry-After asked for (capped), if any.
func (s *Sender) attempt(body []byte) (retry bool, after time.Duration, err error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.o.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.o.URL, bytes.NewReader(body))
	if err != nil {
		return false, 0, fmt.Errorf("alert: build request to %s: %w", s.target, unwrapURL(err))
	}
	for k, vs := range s.o.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	resp, err := s.o.Client.Do(req)
	if err != nil {
		return true, 0, fmt.Errorf("alert: post to %s: %w", s.target, unwrapURL(err))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
	code := resp.StatusCode
	switch {
	case code >= 200 && code < 300:
		return false, 0, nil
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		retry, after = true, retryAfter(resp.Header.Get("Retry-After"))
	case code == http.StatusRequestTimeout || code >= 500:
		retry = true
	}
	return retry, after, fmt.Errorf("alert: post to %s: status %d", s.target, code)
}

func (s *Sender) warn(e Event, attempts int, err error) {
	s.o.Logger.Warn("alert: webhook failed",
		zap.String("webhook", s.target),
		zap.String("tree", e.Tree),
		zap.String("tier", e.Tier),
		zap.Int("threshold", e.Threshold),
		zap.Int("attempts", attempts),
		zap.Error(err))
}

// unwrapURL strips the url.Errors from err: they repeat the URL, whose
// query or user name may hold a token.
func unwrapURL(err error) error {
	for {
		var ue *url.Error
		if !errors.As(err, &ue) || ue.Err == nil {
			return err
		}
		err = ue.Err
	}
}

// backoff is the wait before retry n+1 (n from 0): base doubled n times,
// plus up to 20% jitter, saturating rather than overflowing.
func backoff(base time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d <= time.Duration(1<<62)/2; i++ {
		d *= 2
	}
	if j := int64(d / 5); j > 0 {
		d += time.Duration(rand.Int64N(j + 1))
	}
	return d
}

// retryAfter reads a Retry-After in seconds, capped at a minute; 0 when
// absent or not a number of seconds.
func retryAfter(v string) time.Duration {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	if n >= int64(maxRetryAfter/time.Second) {
		return maxRetryAfter
	}
	return time.Duration(n) * time.Second
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
