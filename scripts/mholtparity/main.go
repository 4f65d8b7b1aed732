// Command mholtparity drives the same traffic, at the same instants, to a
// Caddy built with mholt/caddy-ratelimit and to one built with Cascade, both
// running scripts/mholt-parity.sh's Caddyfile, and compares how many
// requests each admits. It is run by scripts/mholt-parity.sh.
//
//	mholtparity -freeports 2                 # print two free loopback ports
//	mholtparity -mholt http://127.0.0.1:P1 -cascade http://127.0.0.1:P2
//
// Each pattern has a client key of its own, so patterns run side by side
// without sharing a bucket. Every request goes to both servers at once; a
// burst's requests go one after the other. Besides the two servers' counts
// the table shows what mholt's rule predicts from the instants the requests
// were sent (a request is admitted iff now − the oldest of the last N
// admitted > window; refusals are not recorded), and how close any of those
// decisions came to the window's edge.
//
// Exit status: 0 if mholt and Cascade admitted the same number in every
// pattern, 1 if not, 2 if the run itself failed (a server unreachable, an
// answer other than 200 or 429).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"
)

// shot is one scheduled send: n requests, one after the other, at offset
// from the start.
type shot struct {
	at time.Duration
	n  int
}

type pattern struct {
	name   string // as in the table
	path   string // the route of the zone
	zone   string // for the table
	events int
	window time.Duration
	client string // X-Client header; empty for the {remote_host} zone
	shots  []shot
}

// sent is one request as sent to both servers.
type sent struct {
	at             time.Duration // since the start, just before sending
	mholt, cascade int           // status codes; 0 for a transport error
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

// every returns one request every interval from first for as long as span
// (first included, first+span excluded).
func every(first, interval, span time.Duration) []shot {
	var s []shot
	for t := first; t < first+span; t += interval {
		s = append(s, shot{t, 1})
	}
	return s
}

func patterns() []pattern {
	two5 := func(name string, shots []shot) pattern { // mholt's README dynamic_example
		return pattern{name, "/dynamic", "2/5s {remote_host}", 2, 5 * time.Second, "", shots}
	}
	three2 := func(name, client string, shots []shot) pattern {
		return pattern{name, "/three", "3/2s X-Client", 3, 2 * time.Second, client, shots}
	}
	hundred10 := func(name, client string, shots []shot) pattern {
		return pattern{name, "/hundred", "100/10s X-Client", 100, 10 * time.Second, client, shots}
	}
	return []pattern{
		two5("(a) 8; +5.2s 8; then 1 per 1.1s (+6.3..+12.9s)",
			append([]shot{{0, 8}, {ms(5.2), 8}}, every(ms(6.3), ms(1.1), ms(7.7))...)),
		three2("(b) 3 at once, then 1 per 0.1s (+0.05..+2.05s)", "b",
			append([]shot{{0, 3}}, every(ms(0.05), ms(0.1), ms(2.05))...)),
		three2("(c) steady just above: 1 per 0.6s for 10s", "c", every(0, ms(0.6), 10*time.Second)),
		three2("(d) steady just below: 1 per 0.7s for 10s", "d", every(0, ms(0.7), 10*time.Second)),
		hundred10("(c') steady just above: 1 per 89ms for 30s", "c2", every(0, 89*time.Millisecond, 30*time.Second)),
		hundred10("(d') steady just below: 1 per 111ms for 30s", "d2", every(0, 111*time.Millisecond, 30*time.Second)),
		three2("(e) bursts of 5, one window + 50ms apart", "e",
			[]shot{{0, 5}, {ms(2.05), 5}, {ms(4.10), 5}, {ms(6.15), 5}}),
	}
}

func main() {
	freePorts := flag.Int("freeports", 0, "print this many free loopback ports and exit")
	mholtURL := flag.String("mholt", "", "base URL of the Caddy with mholt/caddy-ratelimit")
	cascadeURL := flag.String("cascade", "", "base URL of the Caddy with Cascade")
	wait := flag.Duration("wait", 30*time.Second, "how long to wait for both servers to answer /ready")
	limit := flag.Duration("timeout", 80*time.Second, "give up on the traffic after this long")
	flag.Parse()
	if *freePorts > 0 {
		if err := printFreePorts(*freePorts); err != nil {
			fatal(err)
		}
		return
	}
	for _, u := range []string{*mholtURL, *cascadeURL} {
		if err := loopback(u); err != nil {
			fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *limit)
	defer cancel()
	clients := [2]*http.Client{newClient(), newClient()}
	bases := [2]string{strings.TrimRight(*mholtURL, "/"), strings.TrimRight(*cascadeURL, "/")}
	for i, base := range bases {
		if err := ready(ctx, clients[i], base+"/ready", *wait); err != nil {
			fatal(err)
		}
	}

	pats := patterns()
	results := make([][]sent, len(pats))
	start := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	for i, p := range pats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = drive(ctx, p, start, clients, bases)
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		fatal(fmt.Errorf("the traffic did not finish within %v", *limit))
	}
	os.Exit(report(pats, results, time.Since(start)))
}

// drive sends a pattern's requests to both servers and returns what each answered.
func drive(ctx context.Context, p pattern, start time.Time, clients [2]*http.Client, bases [2]string) []sent {
	var out []sent
	for _, s := range p.shots {
		select {
		case <-time.After(time.Until(start.Add(s.at))):
		case <-ctx.Done():
			return out
		}
		for range s.n {
			at := time.Since(start)
			var codes [2]int
			var wg sync.WaitGroup
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					codes[i] = get(ctx, clients[i], bases[i]+p.path, p.client)
				}()
			}
			wg.Wait()
			out = append(out, sent{at, codes[0], codes[1]})
		}
	}
	return out
}

func get(ctx context.Context, c *http.Client, u, client string) int {
	req, err := http.NewRequestWithContext(ctx, "GET", u, nil)
	if err != nil {
		return 0
	}
	if client != "" {
		req.Header.Set("X-Client", client)
	}
	res, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// model is mholt's rule applied to the instants the requests were sent: how
// many it admits, and the closest any decision came to the window's edge.
func model(p pattern, rs []sent) (admitted int, margin time.Duration) {
	var ring []time.Duration // admitted instants
	margin = -1
	for _, r := range rs {
		if len(ring) < p.events {
			ring = append(ring, r.at)
			continue
		}
		age := r.at - ring[len(ring)-p.events]
		if d := (age - p.window).Abs(); margin < 0 || d < margin {
			margin = d
		}
		if age > p.window {
			ring = append(ring, r.at)
		}
	}
	return len(ring), margin
}

func report(pats []pattern, results [][]sent, took time.Duration) int {
	status := 0
	fmt.Printf("%-47s %-18s %5s %6s %6s %8s %10s\n", "pattern", "zone", "reqs", "model", "mholt", "cascade", "edge")
	var diffs []string
	for i, p := range pats {
		rs := results[i]
		var ok [2]int
		for _, r := range rs {
			for j, code := range [2]int{r.mholt, r.cascade} {
				switch code {
				case http.StatusOK:
					ok[j]++
				case http.StatusTooManyRequests:
				default:
					fmt.Fprintf(os.Stderr, "%s: request at %v: status %d from %s\n", p.name, r.at.Round(time.Millisecond), code, []string{"mholt", "cascade"}[j])
					status = 2
				}
			}
		}
		want, margin := model(p, rs)
		mark := ""
		if ok[0] != ok[1] {
			mark = "  DIFFERS"
			if status == 0 {
				status = 1
			}
			diffs = append(diffs, p.name+"\n  mholt   "+sequence(rs, 0)+"\n  cascade "+sequence(rs, 1))
		}
		if ok[0] != want {
			mark += "  (mholt != model)"
		}
		edge := "-"
		if margin >= 0 {
			edge = margin.Round(time.Millisecond).String()
		}
		fmt.Printf("%-47s %-18s %5d %6d %6d %8d %10s%s\n", p.name, p.zone, len(rs), want, ok[0], ok[1], edge, mark)
	}
	fmt.Printf("\ntraffic took %v. model: mholt's rule on the send instants; edge: the closest any of its decisions came to the window's end.\n", took.Round(100*time.Millisecond))
	if len(diffs) > 0 {
		fmt.Println("\nwhere they differ (+ admitted, - refused, x error; | between sends more than 0.3s apart):")
		for _, d := range diffs {
			fmt.Println(d)
		}
	}
	return status
}

// sequence renders one server's answers: + admitted, - refused, x other.
func sequence(rs []sent, server int) string {
	var b strings.Builder
	var last time.Duration
	for i, r := range rs {
		if i > 0 && r.at-last > 300*time.Millisecond {
			b.WriteByte('|')
		}
		last = r.at
		code := r.mholt
		if server == 1 {
			code = r.cascade
		}
		switch code {
		case http.StatusOK:
			b.WriteByte('+')
		case http.StatusTooManyRequests:
			b.WriteByte('-')
		default:
			b.WriteByte('x')
		}
	}
	return b.String()
}

func newClient() *http.Client {
	return &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 64, Proxy: nil},
	}
}

// ready waits until u answers 200.
func ready(ctx context.Context, c *http.Client, u string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		if get(ctx, c, u, "") == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s did not answer 200 within %v", u, wait)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func loopback(u string) error {
	pu, err := url.Parse(u)
	if err != nil || pu.Scheme != "http" {
		return fmt.Errorf("%q: want http://127.0.0.1:PORT", u)
	}
	if ip := net.ParseIP(pu.Hostname()); ip == nil || !ip.IsLoopback() {
		return errors.New(u + ": only loopback addresses are driven")
	}
	return nil
}

func printFreePorts(n int) error {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return nil
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mholtparity:", err)
	os.Exit(2)
}
