package cascade

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/admin"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/simulate"
)

// The simulator's reports are checked against refModel, a model of the
// limits written here from their definitions (docs/algorithms.md), not
// with the engine: GCRA (emission interval I = per/count, tolerance
// τ = burst·I; a cost n at t admits iff max(TAT, t) + n·I − t ≤ τ) and the
// exact sliding window (at most count charges in any window), every tier
// of a path charged all or nothing.

// refLimit is one limit of the model.
type refLimit struct {
	name    string // as the report names it
	count   int64
	per     time.Duration
	burst   int64 // GCRA; 0 means count
	sliding bool
}

// refTier is a tier: its key is the request's client IP, or a constant.
type refTier struct {
	name     string
	constant string // the key when it is a constant
	limits   []refLimit
}

// refModel decides requests by the definitions.
type refModel struct {
	tiers []refTier
	tat   map[string]int64   // GCRA: tier/value/limit → TAT (µs)
	log   map[string][]int64 // sliding: the charges' times (µs)

	requests, admitted int64
	refused            map[string]int64 // by tier
	top                map[string]*refTop
	peaks              map[string]*refPeak
}

type refTop struct {
	count int64
	first time.Time
}

type refPeak struct {
	share float64
	value string
	at    time.Time
}

func newRefModel(tiers ...refTier) *refModel {
	return &refModel{tiers: tiers, tat: map[string]int64{}, log: map[string][]int64{}, refused: map[string]int64{},
		top: map[string]*refTop{}, peaks: map[string]*refPeak{}}
}

// decide decides a request of client ip at t; it returns whether it was
// refused.
func (m *refModel) decide(t time.Time, ip string) bool {
	now := t.UnixMicro()
	m.requests++
	type check struct {
		key, tier, value, limit string
		ok                      bool
		before, after, capacity int64
		apply                   func()
	}
	var checks []check
	for _, tier := range m.tiers {
		value := ip
		if tier.constant != "" {
			value = tier.constant
		}
		for _, l := range tier.limits {
			key := tier.name + "/" + value + "/" + l.name
			c := check{key: key, tier: tier.name, value: value, limit: l.name}
			if l.sliding {
				window := l.per.Microseconds()
				var kept []int64
				for _, at := range m.log[key] {
					if at > now-window {
						kept = append(kept, at)
					}
				}
				m.log[key] = kept
				n := int64(len(kept))
				c.capacity, c.before, c.ok = l.count, l.count-n, n < l.count
				c.after = c.before - 1
				c.apply = func() { m.log[key] = append(m.log[key], now) }
			} else {
				burst := l.burst
				if burst == 0 {
					burst = l.count
				}
				interval := l.per.Microseconds() / l.count
				tau := burst * interval
				tat := max(m.tat[key], now)
				next := tat + interval
				c.capacity, c.ok = burst, next-now <= tau
				c.before = (tau - (tat - now)) / interval
				c.after = (tau - (next - now)) / interval
				c.apply = func() { m.tat[key] = next }
			}
			checks = append(checks, c)
		}
	}
	denied := slices.IndexFunc(checks, func(c check) bool { return !c.ok })
	for _, c := range checks {
		remaining := c.after
		if denied >= 0 {
			remaining = c.before
		}
		share := 1 - float64(min(remaining, c.capacity))/float64(c.capacity)
		pk := c.tier + "/" + c.limit
		if p := m.peaks[pk]; p == nil || share > p.share {
			m.peaks[pk] = &refPeak{share: share, value: c.value, at: t}
		}
	}
	if denied >= 0 {
		c := checks[denied]
		m.refused[c.tier]++
		tk := c.tier + "/" + c.value
		if m.top[tk] == nil {
			m.top[tk] = &refTop{first: t}
		}
		m.top[tk].count++
		return true
	}
	m.admitted++
	for _, c := range checks {
		c.apply()
	}
	return false
}

// genReq is a generated request.
type genReq struct {
	at  time.Time
	ip  string
	dur time.Duration
}

// genLog makes n requests of a few clients, heavy and light, over span,
// at whole seconds (the Common Log Format's resolution), in time order.
func genLog(seed uint64, n int, span time.Duration) []genReq {
	rng := rand.New(rand.NewPCG(seed, seed+1))
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var out []genReq
	for range n {
		// Client i has weight 1/(i+1): a few do most of the traffic.
		client := int(math.Floor(math.Pow(12, rng.Float64()))) // 1..11, skewed to the low ones
		ip := fmt.Sprintf("198.51.100.%d", client)
		// Client i starts 2i s in: each is first refused at its own time.
		start := int64(2 * client)
		at := base.Add(time.Duration(start+rng.Int64N(int64(span/time.Second)-start)) * time.Second)
		out = append(out, genReq{at: at, ip: ip, dur: time.Duration(rng.IntN(900)+1) * time.Millisecond})
	}
	slices.SortStableFunc(out, func(a, b genReq) int { return a.at.Compare(b.at) })
	return out
}

// simLogLines writes the requests in a format. A Caddy log's lines are
// written when each response ended (its ts), so they are out of order by
// up to the longest duration: the simulator sorts them back.
func simLogLines(reqs []genReq, format string) []string {
	var lines []string
	type stamped struct {
		end  time.Time
		line string
	}
	var caddyLines []stamped
	for i, q := range reqs {
		uri := fmt.Sprintf("/v1/items/%d", i)
		switch format {
		case "caddy":
			end := q.at.Add(q.dur)
			b, _ := json.Marshal(map[string]any{
				"level": "info", "ts": float64(end.UnixMicro()) / 1e6, "logger": "http.log.access.log0", "msg": "handled request",
				"request": map[string]any{"remote_ip": q.ip, "remote_port": "40000", "client_ip": q.ip, "proto": "HTTP/1.1",
					"method": "GET", "host": "api.example.com", "uri": uri, "headers": map[string][]string{"Accept": {"*/*"}}},
				"bytes_read": 0, "user_id": "", "duration": q.dur.Seconds(), "size": 2, "status": 200, "resp_headers": map[string][]string{},
			})
			caddyLines = append(caddyLines, stamped{end, string(b)})
		case "combined":
			lines = append(lines, fmt.Sprintf(`%s - - [%s] "GET %s HTTP/1.1" 200 2 "-" "gen/1"`, q.ip, q.at.Format("02/Jan/2006:15:04:05 -0700"), uri))
		case "jsonl":
			b, _ := json.Marshal(map[string]any{"time": q.at.Format(time.RFC3339Nano), "method": "GET", "uri": uri, "remote_ip": q.ip, "status": 200})
			lines = append(lines, string(b))
		}
	}
	slices.SortStableFunc(caddyLines, func(a, b stamped) int { return a.end.Compare(b.end) })
	for _, s := range caddyLines {
		lines = append(lines, s.line)
	}
	return lines
}

func writeSimFile(t *testing.T, dir, name string, lines []string, gz bool) string {
	t.Helper()
	data := []byte(strings.Join(lines, "\n") + "\n")
	if gz {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(data)
		_ = zw.Close()
		data = buf.Bytes()
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// simCaddyfile is a configuration of one rate_limit handler with tree api.
func simCaddyfile(t *testing.T, dir, name, tiers string) string {
	t.Helper()
	cf := fmt.Sprintf(`{
	admin off
	persist_config off
}
:8080 {
	rate_limit {
		tree api {
%s
		}
	}
	respond "ok"
}
`, tiers)
	return writeSimFile(t, dir, name, []string{cf}, false)
}

func runSim(t *testing.T, opts simulate.Options, config, against string) *simulate.Result {
	t.Helper()
	sim, err := loadSimulation(config, "caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	var old simulate.Decider
	if against != "" {
		o, err := loadSimulation(against, "caddyfile")
		if err != nil {
			t.Fatal(err)
		}
		defer o.Close()
		old = o
	}
	res, err := simulate.Run(context.Background(), opts, sim, old)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestSimulateReference replays a generated log, in every format, gzip
// and not, in one file and split across two, and requires the report the
// reference model computes: per-tier counts, the values refused most with
// their first refusals, each limit's peak, and the difference from a
// second configuration.
func TestSimulateReference(t *testing.T) {
	dir := t.TempDir()
	newTiers := `
			tier global all {
				limit 20/s
			}
			tier ip {client_ip} {
				limit 5/s burst 3
				limit 60/10s sliding
				sensitive off
			}`
	oldTiers := `
			tier global all {
				limit 20/s
			}
			tier ip {client_ip} {
				limit 4/s burst 6
				sensitive off
			}`
	config := simCaddyfile(t, dir, "new.caddyfile", newTiers)
	against := simCaddyfile(t, dir, "old.caddyfile", oldTiers)
	reqs := genLog(7, 3000, 40*time.Second)

	for _, tc := range []struct {
		name   string
		format string
		gz     bool
		split  bool
	}{
		{"caddy", "caddy", false, false},
		{"caddy gzip", "caddy", true, false},
		{"combined", "combined", false, false},
		{"combined gzip, two files", "combined", true, true},
		{"jsonl", "jsonl", false, false},
		{"jsonl two files", "jsonl", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var files []string
			parts := [][]genReq{reqs}
			if tc.split { // every third request in a second file
				var a, b []genReq
				for i, q := range reqs {
					if i%3 == 2 {
						b = append(b, q)
					} else {
						a = append(a, q)
					}
				}
				parts = [][]genReq{a, b}
			}
			for i, p := range parts {
				files = append(files, writeSimFile(t, t.TempDir(), fmt.Sprintf("access%d.log", i), simLogLines(p, tc.format), tc.gz))
			}
			newRef, oldRef, byNew, byOld := refRun(replayOrder(parts, tc.format))
			if newRef.refused["ip"] == 0 || newRef.refused["global"] == 0 || byNew == 0 || byOld == 0 {
				t.Fatalf("the generated log must exercise every case: refused %v, by new only %d, by old only %d", newRef.refused, byNew, byOld)
			}
			res := runSim(t, simulate.Options{Files: files}, config, against)
			if res.Malformed != 0 || res.Report.Requests != int64(len(reqs)) {
				t.Fatalf("replayed %d requests (%d malformed: %v), want %d", res.Report.Requests, res.Malformed, res.MalformedLines, len(reqs))
			}
			checkReport(t, res.Report, newRef)
			checkReport(t, res.Against, oldRef)
			if res.Diff.DeniedByNew != byNew || res.Diff.DeniedByOld != byOld {
				t.Errorf("difference: %d by new only, %d by old only; the model says %d and %d", res.Diff.DeniedByNew, res.Diff.DeniedByOld, byNew, byOld)
			}
		})
	}
}

// refRun decides the requests, in order, by the models of the two
// configurations of TestSimulateReference, and counts the requests each
// refused and the other did not.
func refRun(order []genReq) (newRef, oldRef *refModel, byNew, byOld int64) {
	newRef = newRefModel(
		refTier{name: "global", constant: "all", limits: []refLimit{{name: "20/s", count: 20, per: time.Second}}},
		refTier{name: "ip", limits: []refLimit{
			{name: "5/s burst 3", count: 5, per: time.Second, burst: 3},
			{name: "60/10s sliding", count: 60, per: 10 * time.Second, sliding: true},
		}})
	oldRef = newRefModel(
		refTier{name: "global", constant: "all", limits: []refLimit{{name: "20/s", count: 20, per: time.Second}}},
		refTier{name: "ip", limits: []refLimit{{name: "4/s burst 6", count: 4, per: time.Second, burst: 6}}})
	for _, q := range order {
		n, o := newRef.decide(q.at, q.ip), oldRef.decide(q.at, q.ip)
		switch {
		case n && !o:
			byNew++
		case o && !n:
			byOld++
		}
	}
	return newRef, oldRef, byNew, byOld
}

// replayOrder is the order the files' requests are replayed in, as the
// logs' documentation promises: by time; at one time, file by file as
// given, and within a file line by line (a Caddy log's lines are in the
// order the responses ended).
func replayOrder(parts [][]genReq, format string) []genReq {
	type placed struct {
		q          genReq
		file, line int
	}
	var all []placed
	for f, p := range parts {
		lines := slices.Clone(p)
		if format == "caddy" {
			slices.SortStableFunc(lines, func(a, b genReq) int { return a.at.Add(a.dur).Compare(b.at.Add(b.dur)) })
		}
		for i, q := range lines {
			all = append(all, placed{q, f, i})
		}
	}
	slices.SortFunc(all, func(a, b placed) int {
		if c := a.q.at.Compare(b.q.at); c != 0 {
			return c
		}
		if a.file != b.file {
			return a.file - b.file
		}
		return a.line - b.line
	})
	out := make([]genReq, len(all))
	for i, p := range all {
		out[i] = p.q
	}
	return out
}

// checkReport compares a report of tree api with the model's counts.
func checkReport(t *testing.T, rep *simulate.Report, m *refModel) {
	t.Helper()
	if rep.Requests != m.requests || rep.Admitted != m.admitted || rep.Refused != m.requests-m.admitted {
		t.Errorf("requests %d admitted %d refused %d; the model says %d %d %d", rep.Requests, rep.Admitted, rep.Refused, m.requests, m.admitted, m.requests-m.admitted)
	}
	if len(rep.Trees) != 1 || rep.Trees[0].Tree != "api" || rep.Trees[0].Mode != engine.Enforce {
		t.Fatalf("trees %+v, want api alone, enforcing", rep.Trees)
	}
	tree := rep.Trees[0]
	if tree.Requests != m.requests || tree.Admitted != m.admitted || tree.Refused != m.requests-m.admitted {
		t.Errorf("tree counts %+v", tree.Counts)
	}
	for _, tier := range tree.Tiers {
		if tier.Requests != m.requests || tier.Admitted != m.admitted || tier.Refused != m.refused[tier.Tier] {
			t.Errorf("tier %s: %+v; the model says %d requests, %d admitted, %d refused", tier.Tier, tier.Counts, m.requests, m.admitted, m.refused[tier.Tier])
		}
	}
	if len(tree.Tiers) != 2 {
		t.Errorf("tiers %d, want 2", len(tree.Tiers))
	}
	if len(rep.TopRefused) != min(len(m.top), 20) {
		t.Errorf("%d values refused listed, the model has %d", len(rep.TopRefused), len(m.top))
	}
	for _, v := range rep.TopRefused {
		want := m.top[v.Tier+"/"+v.Value]
		if want == nil || v.Count != uint64(want.count) || v.Error != 0 || !v.First.Equal(want.first) {
			t.Errorf("refused %s %s: %d times, first at %s; the model says %+v", v.Tier, v.Value, v.Count, v.First, want)
		}
	}
	if len(rep.Peaks) != len(m.peaks) {
		t.Errorf("%d peaks, the model has %d", len(rep.Peaks), len(m.peaks))
	}
	for _, p := range rep.Peaks {
		want := m.peaks[p.Tier+"/"+p.Limit]
		if want == nil || math.Abs(p.Share-want.share) > 1e-9 || p.Value != want.value || !p.At.Equal(want.at) {
			t.Errorf("peak of %s %s: %.4f of %q at %s; the model says %+v", p.Tier, p.Limit, p.Share, p.Value, p.At, want)
		}
	}
}

// recordingDecider keeps, by the X-Req-Id header of each request, whether
// the configuration refused it.
type recordingDecider struct {
	simulate.Decider
	refused map[string]bool
}

func (d *recordingDecider) Decide(r *simulate.Request, out *simulate.Outcome) error {
	err := d.Decider.Decide(r, out)
	d.refused[r.Header.Get("X-Req-Id")] = out.Refused
	return err
}

// TestSimulateMatchesCaddy sends a few seconds of traffic, paced, through
// a real Caddy that logs it, replays Caddy's own access log through the
// simulator with the same configuration, and requires the same requests
// refused. The bursts keep clear of the moments a window lets a charge go
// (150 ms either side), so that the microseconds between a request's
// arrival and its decision cannot change the answer.
func TestSimulateMatchesCaddy(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "access.log")
	port := freePort(t)
	const window = 2 * time.Second
	site := fmt.Sprintf(`
http://127.0.0.1:%d {
	log {
		output file %s
		format json
	}
	rate_limit {
		tree api {
			tier user {header.X-User} {
				limit 3/2s sliding
			}
		}
	}
	respond "ok" 200
}
`, port, logFile)
	startCaddy(t, site)
	config := writeSimFile(t, dir, "Caddyfile", []string{globalOptions() + site}, false)

	type burst struct {
		at   time.Duration
		user string
		n    int
	}
	bursts := []burst{
		{0, "ann", 5}, {500 * time.Millisecond, "bob", 2}, {1000 * time.Millisecond, "ann", 2},
		{1500 * time.Millisecond, "bob", 2}, {2000 * time.Millisecond, "bob", 1}, {2400 * time.Millisecond, "ann", 4},
		{3000 * time.Millisecond, "bob", 3}, {3200 * time.Millisecond, "ann", 1}, {3800 * time.Millisecond, "cy", 4},
		{4700 * time.Millisecond, "ann", 3}, {5300 * time.Millisecond, "bob", 4}, {5500 * time.Millisecond, "ann", 1},
		{6300 * time.Millisecond, "cy", 2},
	}
	for i, b := range bursts { // the schedule keeps its margins
		for _, a := range bursts[:i] {
			if d := b.at - (a.at + window); a.user == b.user && d > -150*time.Millisecond && d < 150*time.Millisecond {
				t.Fatalf("burst at %s of %s is within 150 ms of the end of the window of the one at %s", b.at, b.user, a.at)
			}
		}
	}
	caddyRefused := map[string]bool{}
	start := time.Now()
	seq := 0
	for _, b := range bursts {
		time.Sleep(time.Until(start.Add(b.at))) // pacing real traffic: this test is about real time
		for range b.n {
			seq++
			id := fmt.Sprintf("r%d", seq)
			res := do(t, "GET", fmt.Sprintf("http://127.0.0.1:%d/x", port), "X-User: "+b.user, "X-Req-Id: "+id)
			if res.status != 200 && res.status != 429 {
				t.Fatalf("request %s: status %d", id, res.status)
			}
			caddyRefused[id] = res.status == 429
		}
	}
	waitFor(t, "Caddy to log every request", func() bool {
		b, _ := os.ReadFile(logFile)
		return bytes.Count(b, []byte(`"X-Req-Id"`)) == seq
	})

	sim, err := loadSimulation(config, "")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	rec := &recordingDecider{Decider: sim, refused: map[string]bool{}}
	res, err := simulate.Run(context.Background(), simulate.Options{Files: []string{logFile}}, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	refusals := 0
	for id, refused := range caddyRefused {
		got, ok := rec.refused[id]
		if !ok || got != refused {
			t.Errorf("request %s: Caddy refused it: %v; the simulator: %v (replayed: %v)", id, refused, got, ok)
		}
		if refused {
			refusals++
		}
	}
	if refusals == 0 || refusals == seq || res.Report.Refused != int64(refusals) || res.Malformed != 0 {
		t.Errorf("Caddy refused %d of %d; the report says %d refused, %d malformed lines", refusals, seq, res.Report.Refused, res.Malformed)
	}
}

// jsonlLog writes requests in the JSONL form: each at base plus its
// offset, with the header given.
func jsonlLog(t *testing.T, header string, reqs map[time.Duration]string) string {
	t.Helper()
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	offsets := make([]time.Duration, 0, len(reqs))
	for at := range reqs {
		offsets = append(offsets, at)
	}
	slices.Sort(offsets)
	var lines []string
	for _, at := range offsets {
		b, _ := json.Marshal(map[string]any{"time": base.Add(at).Format(time.RFC3339Nano), "method": "POST", "uri": "/v1/x",
			"remote_ip": "192.0.2.9", "headers": map[string]string{header: reqs[at]}, "status": 200})
		lines = append(lines, string(b))
	}
	return writeSimFile(t, t.TempDir(), "access.jsonl", lines, false)
}

// TestSimulateShaping: the requests a penalty box or max_wait changed are
// counted as such.
func TestSimulateShaping(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name     string
		tier     string
		handler  string
		reqs     map[time.Duration]string
		refused  int64
		penalty  int64
		maxWait  int64
		longest  time.Duration
		admitted int64
	}{
		{
			// 2/min: t0 and t1 admitted, t2 and t3 refused by the limit (the
			// second refusal boxes the value for a minute), t31 admitted by
			// the limit (a token back at 30 s) but refused by the box.
			name: "penalty", tier: "limit 2/min\n\t\t\t\tpenalty 1m after 2",
			reqs:    map[time.Duration]string{0: "ann", 1 * s: "ann", 2 * s: "ann", 3 * s: "ann", 31 * s: "ann"},
			refused: 3, penalty: 1, admitted: 2,
		},
		{
			// 1/s burst 1, max_wait 5s: the second request is held 900 ms,
			// the third 1.8 s; none is refused.
			name: "max_wait", tier: "limit 1/s burst 1", handler: "max_wait 5s",
			reqs:    map[time.Duration]string{0: "ann", 100 * time.Millisecond: "ann", 200 * time.Millisecond: "ann"},
			maxWait: 2, longest: 1800 * time.Millisecond, admitted: 3,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cf := writeSimFile(t, dir, "shaping.caddyfile", []string{fmt.Sprintf(`{
	admin off
}
:8080 {
	rate_limit {
		tree api {
			tier user {header.X-User} {
				%s
			}
		}
		%s
	}
	respond "ok"
}
`, tc.tier, tc.handler)}, false)
			res := runSim(t, simulate.Options{Files: []string{jsonlLog(t, "X-User", tc.reqs)}}, cf, "")
			rep := res.Report
			if rep.Refused != tc.refused || rep.Admitted != tc.admitted || rep.Penalty != tc.penalty || rep.MaxWait != tc.maxWait || rep.MaxWaitLongest != tc.longest {
				t.Errorf("refused %d admitted %d penalty %d max_wait %d (longest %s); want %d %d %d %d (%s)",
					rep.Refused, rep.Admitted, rep.Penalty, rep.MaxWait, rep.MaxWaitLongest, tc.refused, tc.admitted, tc.penalty, tc.maxWait, tc.longest)
			}
		})
	}
}

// TestSimulateCommand runs `caddy rate-limit simulate` as the command
// line does: a sensitive tier's values are shown as fingerprints, in the
// text and in the JSON.
func TestSimulateCommand(t *testing.T) {
	dir := t.TempDir()
	const secret = "0123456789abcdef0123456789abcdef"
	cf := writeSimFile(t, dir, "Caddyfile", []string{`{
	admin off
}
:8080 {
	rate_limit {
		tree api {
			tier key {header.X-Api-Key} {
				limit 2/min
			}
		}
		fingerprint_secret ` + secret + `
	}
	respond "ok"
}
`}, false)
	key := "sk-live-very-secret"
	log := jsonlLog(t, "X-Api-Key", map[time.Duration]string{0: key, time.Second: key, 2 * time.Second: key, 3 * time.Second: key})
	want := engine.NewFingerprints([]byte(secret), nil, nil).Value(key)
	for _, asJSON := range []bool{false, true} {
		var out, errOut bytes.Buffer
		cmd := admin.NewCommand()
		args := []string{"simulate", "--config", cf, "--log", log}
		if asJSON {
			args = append(args, "--json")
		}
		cmd.SetArgs(args)
		cmd.SetOut(&out)
		cmd.SetErr(&errOut)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut.String())
		}
		if strings.Contains(out.String(), key) || !strings.Contains(out.String(), want) {
			t.Fatalf("json %v: the report must show the key's fingerprint %s, never the key:\n%s", asJSON, want, out.String())
		}
		if asJSON {
			var res simulate.Result
			if err := json.Unmarshal(out.Bytes(), &res); err != nil {
				t.Fatal(err)
			}
			if res.Report.Refused != 2 || len(res.Report.TopRefused) != 1 || res.Report.TopRefused[0].Value != want ||
				!res.Report.TopRefused[0].First.Equal(time.Date(2026, 11, 20, 9, 0, 2, 0, time.UTC)) {
				t.Errorf("report %+v", res.Report)
			}
		}
	}
	for _, bad := range [][]string{
		{"simulate", "--log", log},
		{"simulate", "--config", cf},
		{"simulate", "--config", cf, "--log", log, "--format", "apache2"},
		{"simulate", "--config", cf, "--log", log, "--from", "last tuesday"},
		{"simulate", "--config", filepath.Join(dir, "nope"), "--log", log},
	} {
		cmd := admin.NewCommand()
		cmd.SetArgs(bad)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		if err := cmd.Execute(); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// TestRolloutDoc runs the example of docs/rollout.md: its Caddyfile, its
// log, and the report it shows.
func TestRolloutDoc(t *testing.T) {
	doc, err := os.ReadFile("docs/rollout.md")
	if err != nil {
		t.Fatal(err)
	}
	_, blocks := parseMarkdown(string(doc))
	first := func(lang string) string {
		for _, b := range blocks {
			if b.lang == lang {
				return b.body
			}
		}
		t.Fatalf("docs/rollout.md has no %s block", lang)
		return ""
	}
	dir := t.TempDir()
	cf := writeSimFile(t, dir, "Caddyfile.new", []string{first("caddyfile")}, false)
	log := writeSimFile(t, dir, "api.jsonl", []string{strings.TrimSpace(first("jsonl"))}, false)
	res := runSim(t, simulate.Options{Files: []string{log}}, cf, "")
	var out bytes.Buffer
	if err := res.WriteText(&out, "Caddyfile.new", ""); err != nil {
		t.Fatal(err)
	}
	if want := first("text"); out.String() != want {
		t.Errorf("docs/rollout.md shows:\n%s\nthe simulation prints:\n%s", want, out.String())
	}
}

// TestSimulateRoutes: a request reaches a rate_limit handler only through
// routes whose matchers match it, and the keys read what a vars handler
// before it set; a second configuration (--against) sees the same
// requests unchanged.
func TestSimulateRoutes(t *testing.T) {
	dir := t.TempDir()
	cf := writeSimFile(t, dir, "routes.caddyfile", []string{`{
	admin off
}
:8080 {
	handle /admin/* {
		respond "admin" 200
	}
	handle {
		vars team {header.X-Team}
		request_header X-Team rewritten
		rate_limit {
			tree t {
				tier team {vars.team} {
					limit 2/min
					sensitive off
				}
			}
		}
		respond "ok" 200
	}
}
`}, false)
	plain := writeSimFile(t, dir, "plain.caddyfile", []string{`{
	admin off
}
:8080 {
	rate_limit {
		tree t {
			tier team {header.X-Team} {
				limit 3/min
			}
		}
	}
	respond "ok" 200
}
`}, false)
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for i, uri := range []string{"/x", "/admin/a", "/x", "/admin/b", "/x", "/x", "/admin/c"} {
		b, _ := json.Marshal(map[string]any{"time": base.Add(time.Duration(i) * time.Second).Format(time.RFC3339), "method": "GET",
			"uri": uri, "remote_ip": "192.0.2.1", "headers": map[string]string{"X-Team": "blue"}})
		lines = append(lines, string(b))
	}
	log := writeSimFile(t, dir, "routes.jsonl", lines, false)
	res := runSim(t, simulate.Options{Files: []string{log}}, cf, plain)
	rep := res.Report
	if rep.Unlimited != 3 || rep.Admitted != 2 || rep.Refused != 2 || len(rep.TopRefused) != 1 || rep.TopRefused[0].Value != "blue" {
		t.Errorf("unlimited %d admitted %d refused %d, top %+v: want 3 2 2, blue (the var, not the rewritten header)", rep.Unlimited, rep.Admitted, rep.Refused, rep.TopRefused)
	}
	// The plain configuration limits every request, by the header as logged.
	if old := res.Against; old.Unlimited != 0 || old.Refused != 4 || old.TopRefused[0].Value == "rewritten" {
		t.Errorf("against: unlimited %d refused %d top %+v: want 0, 4, not the rewritten header", old.Unlimited, old.Refused, old.TopRefused)
	}
}

// TestSimulateConcurrency: a concurrency limit's slot is held for its
// request's logged duration, as an independent count of the requests in
// flight says.
func TestSimulateConcurrency(t *testing.T) {
	dir := t.TempDir()
	cf := writeSimFile(t, dir, "conc.caddyfile", []string{`{
	admin off
}
:8080 {
	rate_limit {
		tree t {
			tier user {header.X-User} {
				limit 2 concurrent
			}
		}
	}
	respond "ok" 200
}
`}, false)
	rng := rand.New(rand.NewPCG(3, 4))
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	type req struct {
		at   time.Time
		dur  time.Duration
		user string
	}
	var reqs []req
	for range 400 {
		reqs = append(reqs, req{at: base.Add(time.Duration(rng.Int64N(int64(60 * time.Second)))).Truncate(time.Millisecond),
			dur: time.Duration(rng.IntN(3000)+1) * time.Millisecond, user: fmt.Sprint("u", rng.IntN(3))})
	}
	slices.SortStableFunc(reqs, func(a, b req) int { return a.at.Compare(b.at) })
	// The model: a request is admitted when fewer than 2 of its user's
	// admitted requests are in flight (a response that ended at the same
	// moment has ended).
	ends := map[string][]time.Time{}
	refused := 0
	var lines []string
	for _, q := range reqs {
		live := slices.DeleteFunc(ends[q.user], func(end time.Time) bool { return !end.After(q.at) })
		if len(live) < 2 {
			live = append(live, q.at.Add(q.dur))
		} else {
			refused++
		}
		ends[q.user] = live
		b, _ := json.Marshal(map[string]any{"time": q.at.Format(time.RFC3339Nano), "method": "GET", "uri": "/", "remote_ip": "192.0.2.1",
			"headers": map[string]string{"X-User": q.user}, "duration": q.dur.Seconds()})
		lines = append(lines, string(b))
	}
	if refused == 0 {
		t.Fatal("the generated log must reach the limit")
	}
	res := runSim(t, simulate.Options{Files: []string{writeSimFile(t, dir, "conc.jsonl", lines, false)}}, cf, "")
	if res.Report.Refused != int64(refused) || res.Report.Admitted != int64(len(reqs)-refused) {
		t.Errorf("refused %d admitted %d; the model says %d %d", res.Report.Refused, res.Report.Admitted, refused, len(reqs)-refused)
	}
}

// TestSimulateNotes: a cost that needs the body is charged its default,
// and a key read from a header Caddy's log redacted is one value; the
// report says both.
func TestSimulateNotes(t *testing.T) {
	dir := t.TempDir()
	cf := writeSimFile(t, dir, "notes.caddyfile", []string{`{
	admin off
}
:8080 {
	rate_limit {
		tree llm {
			tier key {header.Authorization} {
				limit 1000 tokens/min
			}
		}
		tree models {
			tier model {http.rate_limit.model} {
				limit 1000/min
				missing skip
			}
		}
		cost tokens llm {
			on_malformed default
			default_cost 400
		}
	}
	respond "ok" 200
}
`}, false)
	log := jsonlLog(t, "Authorization", map[time.Duration]string{0: "REDACTED", time.Second: "REDACTED", 2 * time.Second: "REDACTED"})
	res := runSim(t, simulate.Options{Files: []string{log}}, cf, "")
	// 400 tokens each of a burst of 1000: the third is refused.
	if res.Report.Admitted != 2 || res.Report.Refused != 1 {
		t.Errorf("admitted %d refused %d, want 2 and 1 (each charged 400 of 1000)", res.Report.Admitted, res.Report.Refused)
	}
	notes := strings.Join(res.Report.Notes, "\n")
	for _, want := range []string{"cost tokens (llm) reads the request body", "charged its default, 400", "(3 requests decided)",
		"header Authorization, logged as REDACTED in 3 requests", "({http.rate_limit.model}) found none"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
}

// simJSONL writes requests in the JSONL form, each a map of its fields
// (time is an offset from 09:00 UTC).
func simJSONL(t *testing.T, reqs []map[string]any) string {
	t.Helper()
	base := time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC)
	var lines []string
	for _, q := range reqs {
		q = maps.Clone(q)
		q["time"] = base.Add(q["time"].(time.Duration)).Format(time.RFC3339Nano)
		for k, v := range map[string]any{"method": "POST", "uri": "/v1/x", "remote_ip": "192.0.2.9", "status": 200} {
			if _, ok := q[k]; !ok {
				q[k] = v
			}
		}
		b, _ := json.Marshal(q)
		lines = append(lines, string(b))
	}
	return writeSimFile(t, t.TempDir(), "access.jsonl", lines, false)
}

// simOneHandler writes a Caddyfile of one rate_limit handler: tree t's
// tiers, then the handler's other options.
func simOneHandler(t *testing.T, tiers, options string) string {
	t.Helper()
	return writeSimFile(t, t.TempDir(), "one.caddyfile", []string{fmt.Sprintf(`{
	admin off
}
:8080 {
	rate_limit {
		tree t {
			%s
		}
		%s
	}
	respond "ok"
}
`, tiers, options)}, false)
}

// TestSimulateIdempotencyReplay: under idempotency replay a retry is
// answered with its first request's kept response, free, once that
// request has ended (as Caddy's handler keeps it); after a server error
// the retry is a new attempt; a response too large to keep has its
// retries refused.
func TestSimulateIdempotencyReplay(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 2/min
			}`, `idempotency {
			replay max_body 1KB
		}`)
	s := time.Second
	req := func(at time.Duration, user, key string, status int, size int64) map[string]any {
		return map[string]any{"time": at, "headers": map[string]string{"X-User": user, "Idempotency-Key": key},
			"status": status, "size": size, "duration": 0.5}
	}
	log := simJSONL(t, []map[string]any{
		req(0, "ann", "k1", 200, 10), req(0, "bob", "k9", 503, 10), req(0, "cy", "k20", 200, 5000),
		req(1*s, "ann", "k1", 200, 10),  // replayed, free
		req(1*s, "bob", "k9", 200, 10),  // the first failed: a new attempt, charged
		req(1*s, "cy", "k20", 200, 10),  // its first response was not kept: 409
		req(2*s, "ann", "k2", 200, 10),  // charged: ann's last token
		req(2*s, "bob", "k9", 200, 10),  // replayed, free
		req(3*s, "ann", "k1", 200, 10),  // replayed, free
		req(3*s, "bob", "k10", 200, 10), // refused: bob's tokens spent
		req(4*s, "ann", "k3", 200, 10),  // refused
	})
	rep := runSim(t, simulate.Options{Files: []string{log}}, cf, "").Report
	if rep.Admitted != 8 || rep.Refused != 2 || rep.Undecided != 1 || len(rep.UndecidedBy) != 1 || rep.UndecidedBy[0].Reason != "idempotency_not_replayable" {
		t.Errorf("admitted %d refused %d not decided %d %v; want 8, 2, 1 not replayable", rep.Admitted, rep.Refused, rep.Undecided, rep.UndecidedBy)
	}
}

// TestSimulateMaxQueued: max_wait holds at most max_queued requests at
// once; one more is refused (queue_full) and its reservation given back.
func TestSimulateMaxQueued(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 1/s burst 1
				sensitive off
			}`, "max_wait 5s\n\t\tmax_queued 1")
	ms := time.Millisecond
	var reqs []map[string]any
	for _, at := range []time.Duration{0, 100 * ms, 200 * ms, 300 * ms, 1500 * ms} {
		reqs = append(reqs, map[string]any{"time": at, "headers": map[string]string{"X-User": "ann"}})
	}
	// 0 admitted; 100 ms held until 1 s; 200 and 300 ms would be held
	// too, but one is: refused; 1.5 s held until 2 s (the refused ones'
	// reservations given back).
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	if rep.Admitted != 3 || rep.Undecided != 2 || rep.MaxWait != 2 || rep.MaxWaitLongest != 900*ms ||
		len(rep.UndecidedBy) != 1 || rep.UndecidedBy[0].Reason != "queue_full" {
		t.Errorf("admitted %d, not decided %d %v, held %d (longest %s); want 3, 2 queue_full, 2 (900ms)",
			rep.Admitted, rep.Undecided, rep.UndecidedBy, rep.MaxWait, rep.MaxWaitLongest)
	}
}

// TestSimulateBodySize: a body_size cost reads the logged bytes_read,
// never a logged header that would pass for it.
func TestSimulateBodySize(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 1000 bytes/min
				sensitive off
			}`, "cost bytes body_size")
	var reqs []map[string]any
	for i := range 3 {
		reqs = append(reqs, map[string]any{"time": time.Duration(i) * time.Second, "bytes_read": 400,
			"headers": map[string]string{"X-User": "ann", simBodySize: "1"}})
	}
	// No bytes_read: charged 0, whatever the header says.
	reqs = append(reqs, map[string]any{"time": 3 * time.Second, "headers": map[string]string{"X-User": "bob", simBodySize: "5000"}})
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	if rep.Admitted != 3 || rep.Refused != 1 || len(rep.TopRefused) != 1 || rep.TopRefused[0].Value != "ann" {
		t.Errorf("admitted %d refused %d top %+v; want ann's third (400 bytes of 1000 each) refused alone", rep.Admitted, rep.Refused, rep.TopRefused)
	}
}

// TestSimulateCommandFlags: the logs a shell's glob gives after one --log
// are all replayed, and flags out of range are refused with a message
// that names them (a --top of a billion would allocate the sketch of ten
// billion values).
func TestSimulateCommandFlags(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 2/min
			}`, "")
	var logs []string
	for i := range 3 {
		logs = append(logs, simJSONL(t, []map[string]any{{"time": time.Duration(i) * time.Second, "headers": map[string]string{"X-User": "ann"}}}))
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := admin.NewCommand()
		cmd.SetArgs(append([]string{"simulate", "--config", cf, "--quiet"}, args...))
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run(append([]string{"--json", "--log"}, logs...)...)
	var res simulate.Result
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Lines != 3 || res.Report.Refused != 1 {
		t.Fatalf("--log a b c: %v\n%s", err, out)
	}
	conf := filepath.Join(t.TempDir(), "site.conf")
	if err := os.WriteFile(conf, []byte(":8080 {\n\trespond ok\n}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", conf}, "give --adapter caddyfile"},
		{[]string{"--against", conf}, "--against: " + conf + ": reading the configuration as Caddy's JSON"},
		{[]string{"--against", conf}, "give --against-adapter caddyfile"},
		{[]string{"--top", "0"}, "--top 0"},
		{[]string{"--top", "1000000000"}, "--top 1000000000"},
		{[]string{"--window", "-1"}, "--window -1"},
		{[]string{"--window", "0"}, "--window 0"},
		{[]string{"--from", "2026-11-21", "--to", "2026-11-20"}, "--from 2026-11-21 is not before --to 2026-11-20"},
		{[]string{"--from", "2026-11-20", "--to", "2026-11-20"}, "is not before"},
	} {
		if _, err := run(append([]string{"--log", logs[0]}, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want one that says %q", tc.args, err, tc.want)
		}
	}
}

// TestSimulateJSONEmpty: the JSON report's lists are empty, never null,
// when nothing is in them (scripts iterate over them).
func TestSimulateJSONEmpty(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 2/min
			}`, "")
	res := runSim(t, simulate.Options{Files: []string{simJSONL(t, []map[string]any{{"time": time.Duration(0), "headers": map[string]string{"X-User": "ann"}}})}}, cf, "")
	var buf bytes.Buffer
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Report map[string]json.RawMessage `json:"report"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"trees", "top_refused", "peaks"} {
		if v := string(doc.Report[field]); !strings.HasPrefix(v, "[") {
			t.Errorf("%s is %s, want a list", field, v)
		}
	}
	if _, ok := doc.Report["first"]; !ok {
		t.Error("first is left out of a report with a request")
	}

	// No request replayed: no first or last time (not year 1).
	res = runSim(t, simulate.Options{Files: []string{simJSONL(t, nil)}}, cf, "")
	buf.Reset()
	if err := res.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	doc.Report = nil
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"first", "last"} {
		if v, ok := doc.Report[field]; ok {
			t.Errorf("%s is %s in a report of no request, want it left out", field, v)
		}
	}
}

// TestSimulateTimePlaceholders: a key that reads the clock through a
// placeholder reads the request's logged time, not the wall clock.
func TestSimulateTimePlaceholders(t *testing.T) {
	cf := simOneHandler(t, `tier second {time.now.unix}-{header.X-User} {
				limit 1/h
				sensitive off
			}`, "")
	ms := time.Millisecond
	var reqs []map[string]any
	for _, at := range []time.Duration{0, 500 * ms, 1000 * ms, 2000 * ms, 2100 * ms} {
		reqs = append(reqs, map[string]any{"time": at, "headers": map[string]string{"X-User": "ann"}})
	}
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	want := fmt.Sprint(time.Date(2026, 11, 20, 9, 0, 0, 0, time.UTC).Unix(), "-ann")
	if rep.Admitted != 3 || rep.Refused != 2 || len(rep.TopRefused) != 2 || rep.TopRefused[0].Value != want && rep.TopRefused[1].Value != want {
		t.Errorf("admitted %d refused %d top %+v; want one admitted a second, %s refused", rep.Admitted, rep.Refused, rep.TopRefused, want)
	}
}

// TestSimulateInFlightBound: requests logged as running for days hold
// their slots until then, but no more of them than the simulation's bound
// are kept in memory: past it the one ending first is ended at once, and
// the notes say how many were.
func TestSimulateInFlightBound(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 1 concurrent
			}`, "")
	var reqs []map[string]any
	for i := range 10 {
		reqs = append(reqs, map[string]any{"time": time.Duration(i) * time.Second, "duration": 1e6,
			"headers": map[string]string{"X-User": fmt.Sprint("u", i%5)}})
	}
	sim, err := loadSimulation(cf, "")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sim.maxInFlight = 3
	res, err := simulate.Run(context.Background(), simulate.Options{Files: []string{simJSONL(t, reqs)}}, sim, nil)
	if err != nil {
		t.Fatal(err)
	}
	// From the 4th on, each request in flight ends the one that took its
	// slot first: u0 at 3 s, u1 at 4 s…, so that every user finds its
	// slot free 5 s later. 7 ended early, none refused.
	if len(sim.inFlight) != 3 || res.Report.Refused != 0 || !strings.Contains(strings.Join(res.Report.Notes, "\n"), "7 requests were ended before their logged end") {
		t.Errorf("in flight %d, refused %d, notes %q", len(sim.inFlight), res.Report.Refused, res.Report.Notes)
	}
}

// TestRolloutDocJSON: every field of the JSON report is in the table of
// docs/rollout.md.
func TestRolloutDocJSON(t *testing.T) {
	doc, err := os.ReadFile("docs/rollout.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "### The JSON report")
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(rt reflect.Type) {
		for rt.Kind() == reflect.Pointer || rt.Kind() == reflect.Slice {
			rt = rt.Elem()
		}
		if rt.Kind() != reflect.Struct || seen[rt] || rt == reflect.TypeFor[time.Time]() {
			return
		}
		seen[rt] = true
		for f := range rt.Fields() {
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name != "" && name != "-" && !strings.Contains(section, "`"+name+"`") && !strings.Contains(section, "`"+name+"[]`") {
				t.Errorf("docs/rollout.md's JSON report does not say what %s (%s.%s) is", name, rt.Name(), f.Name)
			}
			walk(f.Type)
		}
	}
	walk(reflect.TypeFor[simulate.Result]())
}

// TestSimulateCalendar: a calendar quota's day is the zone's, on the log's
// clock: New York's day ends at 05:00 UTC in November.
func TestSimulateCalendar(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 2/day calendar tz America/New_York
				sensitive off
			}`, "")
	var reqs []map[string]any
	for _, at := range []time.Duration{-4 * time.Hour, -10 * time.Minute, -time.Minute, 10 * time.Minute, 20 * time.Minute, 30 * time.Minute} {
		reqs = append(reqs, map[string]any{"time": at - 4*time.Hour, "headers": map[string]string{"X-User": "ann"}}) // from 01:00 UTC
	}
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	// 01:00, 04:50 admitted, 04:59 refused; 05:10, 05:20 admitted (a new
	// day), 05:30 refused.
	if rep.Admitted != 4 || rep.Refused != 2 || len(rep.TopRefused) != 1 || !rep.TopRefused[0].First.Equal(time.Date(2026, 11, 20, 4, 59, 0, 0, time.UTC)) {
		t.Errorf("admitted %d refused %d top %+v; want 4, 2, first at 04:59 UTC", rep.Admitted, rep.Refused, rep.TopRefused)
	}
}

// TestSimulateMissingKey: the requests refused for want of a tier's key
// are listed as (missing), not as the shared bucket of an empty value.
func TestSimulateMissingKey(t *testing.T) {
	cf := simOneHandler(t, `tier user {header.X-User} {
				limit 100/min
				missing deny
			}`, "")
	var reqs []map[string]any
	for i := range 3 {
		reqs = append(reqs, map[string]any{"time": time.Duration(i) * time.Second})
	}
	res := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "")
	var out bytes.Buffer
	if err := res.WriteText(&out, "a", ""); err != nil {
		t.Fatal(err)
	}
	if top := res.Report.TopRefused; len(top) != 1 || !top[0].Missing || top[0].Count != 3 || !strings.Contains(out.String(), "(missing)") || strings.Contains(out.String(), "(shared)") {
		t.Errorf("top %+v:\n%s", top, out.String())
	}
}

// TestSimulateServerPlaceholders: a matcher that reads the server's state
// ({http.shutting_down}, which Caddy reads from the request's server)
// finds a server that is not shutting down, as a running one.
func TestSimulateServerPlaceholders(t *testing.T) {
	cf := writeSimFile(t, t.TempDir(), "drain.caddyfile", []string{`{
	admin off
}
:8080 {
	route {
		@draining vars {http.shutting_down} true
		respond @draining "draining" 503
		rate_limit {
			tree t {
				tier user {header.X-User} {
					limit 1/min
					sensitive off
				}
			}
		}
		respond "ok"
	}
}
`}, false)
	var reqs []map[string]any
	for i := range 3 {
		reqs = append(reqs, map[string]any{"time": time.Duration(i) * time.Second, "headers": map[string]string{"X-User": "ann"}})
	}
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	if rep.Admitted != 1 || rep.Refused != 2 {
		t.Errorf("admitted %d refused %d, undecided %v; want 1 and 2", rep.Admitted, rep.Refused, rep.UndecidedBy)
	}
}

// TestSimulatePanic: a handler or matcher that panics on a request does
// not end the replay: the request is not decided, and the notes say where.
func TestSimulatePanic(t *testing.T) {
	cf := writeSimFile(t, t.TempDir(), "drain.caddyfile", []string{`{
	admin off
}
:8080 {
	route {
		@draining vars {http.shutting_down} true
		respond @draining "draining" 503
		rate_limit {
			tree t {
				tier user {header.X-User} {
					limit 1/min
				}
			}
		}
		respond "ok"
	}
}
`}, false)
	sim, err := loadSimulation(cf, "")
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	sim.server = nil // {http.shutting_down} dereferences it
	log := simJSONL(t, []map[string]any{{"time": time.Duration(0), "headers": map[string]string{"X-User": "ann"}}, {"time": time.Second}})
	res, err := simulate.Run(context.Background(), simulate.Options{Files: []string{log}}, sim, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep := res.Report; rep.Undecided != 2 || len(rep.UndecidedBy) != 1 || rep.UndecidedBy[0].Reason != "panic" ||
		!strings.Contains(strings.Join(rep.Notes, "\n"), "2 requests made a handler or matcher panic (Caddy answers them 500), the first at "+log+":1: ") {
		t.Errorf("undecided %d %v, notes %q", rep.Undecided, rep.UndecidedBy, rep.Notes)
	}
}

// TestSimulateHost: a Combined log has no Host, so a site's host matcher
// never matches its requests; the notes say so, and --host gives them one.
func TestSimulateHost(t *testing.T) {
	cf := writeSimFile(t, t.TempDir(), "Caddyfile", []string{`{
	admin off
}
api.example.com {
	rate_limit {
		tree t {
			tier ip {remote_host} {
				limit 1/min
				sensitive off
			}
		}
	}
	respond "ok"
}
`}, false)
	var lines []string
	for i := range 3 {
		lines = append(lines, fmt.Sprintf(`192.0.2.1 - - [20/Nov/2026:09:00:0%d +0000] "GET / HTTP/1.1" 200 2 "-" "curl/8"`, i))
	}
	log := writeSimFile(t, t.TempDir(), "access.log", lines, false)
	for _, tc := range []struct {
		host               string
		unlimited, refused int64
		note               string
	}{
		{"", 3, 0, "the routes that match a host never matched them; give --host"},
		{"api.example.com", 0, 2, "they were given api.example.com (--host)"},
	} {
		var out bytes.Buffer
		cmd := admin.NewCommand()
		cmd.SetArgs([]string{"simulate", "--config", cf, "--log", log, "--host", tc.host, "--json", "--quiet"})
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		var res simulate.Result
		if err := cmd.Execute(); err != nil || json.Unmarshal(out.Bytes(), &res) != nil {
			t.Fatalf("--host %q: %v\n%s", tc.host, err, out.String())
		}
		if rep := res.Report; rep.Unlimited != tc.unlimited || rep.Refused != tc.refused || !strings.Contains(strings.Join(rep.Notes, "\n"), tc.note) {
			t.Errorf("--host %q: unlimited %d refused %d notes %q; want %d, %d, %q", tc.host, rep.Unlimited, rep.Refused, rep.Notes, tc.unlimited, tc.refused, tc.note)
		}
	}
}

// TestSimulateRewrite: a key that reads the request's URI after a rewrite
// reads the rewritten one, as in Caddy.
func TestSimulateRewrite(t *testing.T) {
	cf := writeSimFile(t, t.TempDir(), "rewrite.caddyfile", []string{`{
	admin off
}
:8080 {
	route {
		rewrite * /v2{uri}
		rate_limit {
			tree t {
				tier uri {http.request.uri} {
					limit 1/min
					sensitive off
				}
			}
		}
		respond "ok"
	}
}
`}, false)
	var reqs []map[string]any
	for i := range 2 {
		reqs = append(reqs, map[string]any{"time": time.Duration(i) * time.Second, "uri": "/x?a=1"})
	}
	rep := runSim(t, simulate.Options{Files: []string{simJSONL(t, reqs)}}, cf, "").Report
	if len(rep.TopRefused) != 1 || rep.TopRefused[0].Value != "/v2/x?a=1" {
		t.Errorf("top %+v; want /v2/x?a=1 refused", rep.TopRefused)
	}
}
