package simulate

import (
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"io"
	"time"
)

// Decider decides logged requests through rate limits, each at its Time;
// Run gives it the requests in time order, from one goroutine.
type Decider interface {
	// Decide decides r and says what happened in out (reset by the
	// caller). It returns an error only when the simulation cannot go on.
	Decide(r *Request, out *Outcome) error
	// Notes are what the report should say about how the requests were
	// decided (a cost charged its default for want of a body...), once
	// every request has been decided.
	Notes() []string
}

// Outcome is what the limits did with one request.
type Outcome struct {
	// Trees are the trees whose limits applied, in the order decided.
	Trees []TreeOutcome
	// Undecided is why the request could not be decided, if it could not
	// (a cost that could not be read, a matcher's error); it is refused
	// when Refused is set too.
	Undecided string
	// Refused is true when the client would have been refused: an
	// enforcing tree's limits refused it, or it could not be decided.
	Refused bool
}

// Denied reports whether some tree's limits denied the request, whatever
// its mode: refused, or would have been in warn or shadow mode.
func (o *Outcome) Denied() bool {
	if o.Refused {
		return true
	}
	for i := range o.Trees {
		if o.Trees[i].Denied {
			return true
		}
	}
	return false
}

// Reset empties o for the next request, keeping its memory.
func (o *Outcome) Reset() {
	for i := range o.Trees {
		o.Trees[i].Tiers = o.Trees[i].Tiers[:0]
		o.Trees[i].Usage = o.Trees[i].Usage[:0]
	}
	o.Trees, o.Undecided, o.Refused = o.Trees[:0], "", false
}

// Next returns a cleared TreeOutcome appended to o.Trees, its slices'
// memory reused.
func (o *Outcome) Next() *TreeOutcome {
	if len(o.Trees) < cap(o.Trees) {
		o.Trees = o.Trees[:len(o.Trees)+1]
		t := &o.Trees[len(o.Trees)-1]
		*t = TreeOutcome{Tiers: t.Tiers[:0], Usage: t.Usage[:0]}
		return t
	}
	o.Trees = append(o.Trees, TreeOutcome{})
	return &o.Trees[len(o.Trees)-1]
}

// TreeOutcome is what one tree's limits did with a request.
type TreeOutcome struct {
	// Handler names the rate_limit handler (its place in the config).
	Handler string
	Tree    string
	// Mode is the tree's mode: enforce, warn or shadow.
	Mode string
	// Tiers are the tiers on the request's path.
	Tiers []string
	// Denied is true when the tree's limits denied the request: refused in
	// mode enforce, would have been in warn or shadow. Tier and Value are
	// the denying tier and its value (shown as the rest of Cascade shows
	// it: a sensitive tier's as a fingerprint); Tier is "" when unknown.
	Denied      bool
	Tier, Value string
	// Reason is the engine's reason for a denial (limited, missing_key…).
	Reason string
	// Penalty is true when only a penalty box denied the request: its
	// limits alone would have admitted it.
	Penalty bool
	// Wait is how long max_wait would have held an admitted request that
	// its limits would otherwise have refused.
	Wait time.Duration
	// Usage is how full each limit of the path was after the request.
	Usage []Usage
}

// Usage is how full one limit of one value was.
type Usage struct {
	Tier, Limit, Value string
	// Share is the part of the limit's capacity in use, 0 to 1.
	Share float64
}

// Options say what to replay.
type Options struct {
	// Files are the logs, merged in time order.
	Files []string
	// Format of every file; Auto detects each file's.
	Format Format
	// Window is how many lines a file's requests may be out of order by;
	// 0 means DefaultWindow.
	Window int
	// From and To, when not zero, bound the requests replayed: From
	// included, To excluded.
	From, To time.Time
	// Progress, when not nil, gets a progress line every Every (default
	// 1s of wall time) once the replay has run that long.
	Progress io.Writer
	Every    time.Duration
	// Top bounds the values listed as refused most, and the examples of
	// differences; 0 means 20.
	Top int

	maxHeld int // the bytes of lines a file's window holds; 0 means maxPendingBytes
}

// Run replays the logs through decider (and, when against is not nil,
// through against as well, each on its own state) and reports what their
// limits did.
func Run(ctx context.Context, opts Options, decider, against Decider) (*Result, error) {
	if len(opts.Files) == 0 {
		return nil, fmt.Errorf("no log to replay: give --log <file>")
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.Top <= 0 {
		opts.Top = 20
	}
	if opts.Every <= 0 {
		opts.Every = time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	m := &merger{}
	for i, name := range opts.Files {
		f := &fileReader{name: name, idx: i, format: opts.Format, window: opts.Window, maxHeld: cmp.Or(opts.maxHeld, maxPendingBytes), out: make(chan batch, 4)}
		go f.read(ctx)
		m.files = append(m.files, &mergeHead{r: f})
	}
	res := &Result{Report: newReport(opts.Top)}
	if against != nil {
		res.Against, res.Diff = newReport(opts.Top), newDiff(opts.Top)
	}
	prog := progress{w: opts.Progress, every: opts.Every, start: time.Now()}
	var out, old Outcome
	for seq := int64(0); ; {
		r, err := m.next(res)
		if err != nil {
			return nil, err
		}
		if r == nil {
			break
		}
		if !opts.From.IsZero() && r.Time.Before(opts.From) || !opts.To.IsZero() && !r.Time.Before(opts.To) {
			res.Outside++
			continue
		}
		r.Seq = seq
		seq++
		out.Reset()
		if err := decider.Decide(r, &out); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", r.File, r.Line, err)
		}
		res.Report.add(r, &out)
		if against != nil {
			old.Reset()
			if err := against.Decide(r, &old); err != nil {
				return nil, fmt.Errorf("%s:%d (--against): %w", r.File, r.Line, err)
			}
			res.Against.add(r, &old)
			res.Diff.add(r, &out, &old)
		}
		if seq&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			prog.tick(res.Lines, r.Time)
		}
	}
	prog.done(res.Lines)
	res.Report.Notes = decider.Notes()
	if against != nil {
		res.Against.Notes = against.Notes()
	}
	res.Report.finish()
	if res.Against != nil {
		res.Against.finish()
	}
	return res, nil
}

// progress writes a line to stderr now and then on a long replay.
type progress struct {
	w     io.Writer
	every time.Duration
	start time.Time
	last  time.Time
	shown bool
}

func (p *progress) tick(lines int64, at time.Time) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if now.Sub(p.start) < p.every || now.Sub(p.last) < p.every {
		return
	}
	p.last, p.shown = now, true
	rate := float64(lines) / now.Sub(p.start).Seconds()
	fmt.Fprintf(p.w, "\rsimulate: %d lines, at %s, %.0f lines/s   ", lines, at.UTC().Format(time.DateTime), rate)
}

func (p *progress) done(lines int64) {
	if p.w != nil && p.shown {
		fmt.Fprintf(p.w, "\rsimulate: %d lines in %s%20s\n", lines, time.Since(p.start).Round(time.Millisecond), "")
	}
}

// merger merges the files' requests in time order.
type merger struct {
	files []*mergeHead
	heap  headHeap
	init  bool
}

// mergeHead is one file's next request.
type mergeHead struct {
	r    *fileReader
	reqs []Request
	done bool
}

// fill makes h's batch non-empty, reading the file's next batch, unless
// the file has ended; it counts what the batch could not read into res.
func (h *mergeHead) fill(res *Result) error {
	for len(h.reqs) == 0 && !h.done {
		b, ok := <-h.r.out
		if !ok {
			h.done = true
			return nil
		}
		res.Lines += b.lines
		res.Malformed += b.bad
		res.Other += b.other
		for _, m := range b.malformed {
			if len(res.MalformedLines) < maxExamples {
				res.MalformedLines = append(res.MalformedLines, m)
			}
		}
		if b.err != nil {
			return b.err
		}
		h.reqs = b.reqs
	}
	return nil
}

// next returns the earliest request of every file's, nil when all have
// ended. The request is valid until the next call.
func (m *merger) next(res *Result) (*Request, error) {
	if !m.init {
		m.init = true
		for _, h := range m.files {
			if err := h.fill(res); err != nil {
				return nil, err
			}
			if len(h.reqs) > 0 {
				m.heap = append(m.heap, h)
			}
		}
		heap.Init(&m.heap)
	} else if len(m.heap) > 0 {
		h := m.heap[0]
		h.reqs = h.reqs[1:]
		if err := h.fill(res); err != nil {
			return nil, err
		}
		if len(h.reqs) == 0 {
			heap.Pop(&m.heap)
		} else {
			heap.Fix(&m.heap, 0)
		}
	}
	if len(m.heap) == 0 {
		return nil, nil
	}
	return &m.heap[0].reqs[0], nil
}

// headHeap orders the files by their next request's time, then by the
// order they were given in.
type headHeap []*mergeHead

func (h headHeap) Len() int { return len(h) }
func (h headHeap) Less(i, j int) bool {
	a, b := &h[i].reqs[0], &h[j].reqs[0]
	if !a.Time.Equal(b.Time) {
		return a.Time.Before(b.Time)
	}
	return h[i].r.idx < h[j].r.idx
}
func (h headHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *headHeap) Push(x any)   { *h = append(*h, x.(*mergeHead)) }
func (h *headHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
