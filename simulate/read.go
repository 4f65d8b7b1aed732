package simulate

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// DefaultWindow is how many lines a file's requests may be out of time
// order by (Caddy logs a request when its response ends, so a slow one
// follows quicker ones that arrived after it): they are sorted within it.
const DefaultWindow = 10000

// maxLine is the longest line read; a longer one is malformed.
const maxLine = 1 << 20

// batchSize is how many requests a file's reader hands over at once, at
// most batchBytes of lines.
const (
	batchSize  = 512
	batchBytes = 4 << 20
)

// maxPendingBytes bounds the lines a file's window holds (a log of
// megabyte lines would otherwise hold the window's count of them): past
// it, its earliest request is replayed, as past the window.
const maxPendingBytes = 64 << 20

// reqOverhead is what a request takes in memory besides its line's bytes,
// and fieldOverhead what each of its header fields takes besides.
const (
	reqOverhead   = 512
	fieldOverhead = 128
)

// Malformed is a line that could not be read as a request.
type Malformed struct {
	File   string `json:"file"`
	Line   int64  `json:"line"`
	Reason string `json:"reason"`
}

// OutOfOrderError is a request logged earlier than one already replayed
// from its file, further out of order than the window sorts.
type OutOfOrderError struct {
	File     string
	Line     int64
	Time     time.Time
	Replayed time.Time
	Window   int
}

func (e *OutOfOrderError) Error() string {
	return fmt.Sprintf("%s:%d: request at %s is %s earlier than one %d or more lines before it (the window sorts requests out of order by up to %d lines): sort the file by time, or give a larger --window",
		e.File, e.Line, e.Time.Format(time.RFC3339Nano), e.Replayed.Sub(e.Time), e.Window, e.Window)
}

// batch is what a file's reader hands over: requests in time order, and
// what it could not read since the last batch.
type batch struct {
	reqs      []Request
	malformed []Malformed // at most maxExamples of them
	bad       int64       // malformed lines
	other     int64       // lines skipped: not access log entries
	lines     int64
	err       error // the file's reading ended with it (then the last batch)
}

// maxExamples bounds the malformed lines a report lists, maxReason the
// length of the reason given for each.
const (
	maxExamples = 20
	maxReason   = 200
)

// fileReader reads one log file in its own goroutine.
type fileReader struct {
	name    string
	idx     int
	format  Format
	window  int
	maxHeld int // the bytes of the lines its window may hold
	out     chan batch
}

// read reads the file to its end (or ctx's), sending batches; it closes
// out when done.
func (f *fileReader) read(ctx context.Context) {
	defer close(f.out)
	err := f.scan(ctx)
	if err != nil {
		f.send(ctx, batch{err: err})
	}
}

func (f *fileReader) send(ctx context.Context, b batch) bool {
	select {
	case f.out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

func (f *fileReader) scan(ctx context.Context) error {
	file, err := os.Open(f.name)
	if err != nil {
		return fmt.Errorf("opening log: %w", err)
	}
	defer file.Close()
	br := bufio.NewReaderSize(file, 256<<10)
	var rd io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: reading gzip: %w", f.name, err)
		}
		defer zr.Close()
		rd = zr
	}
	lr := bufio.NewReaderSize(rd, 256<<10)
	var (
		cur     batch
		pending reqHeap
		held    int // the bytes of the lines in pending
		inBatch int // the bytes of the lines in cur
		last    time.Time
		parse   func([]byte, *Request) error
		lineNo  int64
		long    []byte // a line longer than lr's buffer, so far
		tooLong bool   // the line is longer than maxLine
	)
	flush := func() bool {
		ok := f.send(ctx, cur)
		cur, inBatch = batch{reqs: make([]Request, 0, batchSize)}, 0
		return ok
	}
	cur.reqs = make([]Request, 0, batchSize)
	bad := func(reason string) {
		if len(reason) > maxReason { // it may quote the line
			reason = strings.ToValidUTF8(reason[:maxReason], "") + "…"
		}
		cur.bad++
		if len(cur.malformed) < maxExamples {
			cur.malformed = append(cur.malformed, Malformed{File: f.name, Line: lineNo, Reason: reason})
		}
	}
	for {
		line, err := lr.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			if tooLong = tooLong || len(long)+len(line) > maxLine; tooLong {
				long = long[:0]
			} else {
				long = append(long, line...)
			}
			continue
		}
		if len(long) > 0 {
			line, long = append(long, line...), long[:0]
		}
		over := tooLong || len(line) > maxLine+2
		tooLong = false
		if len(line) > 0 || over { // over: the file may end just after a long line's buffers
			lineNo++
			cur.lines++
			if n := len(line); n > 0 && line[n-1] == '\n' {
				line = line[:n-1]
				if n > 1 && line[n-2] == '\r' {
					line = line[:n-2]
				}
			}
			switch {
			case over:
				bad("line longer than 1 MiB")
			case len(bytes.TrimSpace(line)) == 0:
				cur.lines-- // blank: not a line of the log
			default:
				if parse == nil {
					format := f.format
					if format == Auto {
						format = detect(line)
					}
					parse = parserOf(format)
				}
				var r Request
				switch perr := safely(parse, line, &r); {
				case errors.Is(perr, errNotAccess):
					cur.other++
				case perr != nil:
					bad(perr.Error())
				default:
					if r.Time.Before(last) {
						return &OutOfOrderError{File: f.name, Line: lineNo, Time: r.Time, Replayed: last, Window: f.window}
					}
					r.File, r.Line = f.name, lineNo
					r.size = len(line) + reqOverhead + fieldOverhead*(len(r.Header)+len(r.RespHeader))
					heap.Push(&pending, r)
					held += r.size
					for pending.Len() > f.window || held > f.maxHeld {
						next := heap.Pop(&pending).(Request)
						last, held, inBatch = next.Time, held-next.size, inBatch+next.size
						cur.reqs = append(cur.reqs, next)
					}
				}
			}
			if (len(cur.reqs) >= batchSize || inBatch >= batchBytes) && !flush() {
				return ctx.Err()
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: line %d: %w", f.name, lineNo+1, err)
		}
	}
	for pending.Len() > 0 {
		next := heap.Pop(&pending).(Request)
		cur.reqs, inBatch = append(cur.reqs, next), inBatch+next.size
		if (len(cur.reqs) >= batchSize || inBatch >= batchBytes) && !flush() {
			return ctx.Err()
		}
	}
	if len(cur.reqs) > 0 || cur.bad > 0 || cur.other > 0 || cur.lines > 0 {
		flush()
	}
	return nil
}

// safely runs parse, turning a panic into an error: no line stops a
// replay.
func safely(parse func([]byte, *Request) error, line []byte, r *Request) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("unreadable: %v", p)
		}
	}()
	return parse(line, r)
}

// reqHeap orders a file's pending requests by time, then line.
type reqHeap []Request

func (h reqHeap) Len() int { return len(h) }
func (h reqHeap) Less(i, j int) bool {
	if !h[i].Time.Equal(h[j].Time) {
		return h[i].Time.Before(h[j].Time)
	}
	return h[i].Line < h[j].Line
}
func (h reqHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *reqHeap) Push(x any)   { *h = append(*h, x.(Request)) }
func (h *reqHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = Request{}
	*h = old[:len(old)-1]
	return r
}
