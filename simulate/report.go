package simulate

import (
	"cmp"
	"crypto/sha256"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddy-cascade/cascade/topk"
)

// Result is a replay's outcome: what was read, and the report of each
// configuration.
type Result struct {
	// Lines read, Malformed among them (the first few in MalformedLines),
	// Other lines skipped (not access log entries: another logger's), and
	// requests Outside --from/--to.
	Lines          int64       `json:"lines"`
	Malformed      int64       `json:"malformed"`
	MalformedLines []Malformed `json:"malformed_lines,omitempty"`
	Other          int64       `json:"other_lines,omitempty"`
	Outside        int64       `json:"outside_range,omitempty"`
	// Report is the configuration's; Against and Diff are there with
	// --against: the other configuration's report, and where they differ.
	Report  *Report `json:"report"`
	Against *Report `json:"against,omitempty"`
	Diff    *Diff   `json:"difference,omitempty"`
}

// Report is what one configuration's limits did with the requests.
type Report struct {
	// Requests replayed; First and Last their times.
	Requests    int64        `json:"requests"`
	First       time.Time    `json:"first,omitzero"` // left out when no request was replayed
	Last        time.Time    `json:"last,omitzero"`
	Admitted    int64        `json:"admitted"`
	Refused     int64        `json:"refused"`
	WouldBlock  int64        `json:"would_block"`            // denied by a tree in warn or shadow mode only
	Undecided   int64        `json:"undecided,omitempty"`    // could not be decided (see UndecidedBy)
	Unlimited   int64        `json:"unlimited"`              // no tree applied
	UndecidedBy []Count      `json:"undecided_by,omitempty"` // reasons, most first
	Trees       []*TreeStats `json:"trees"`
	// TopRefused are the values denied most, by tree and tier.
	TopRefused []TopValue `json:"top_refused"`
	// Peaks are each limit's fullest moment: who came closest.
	Peaks []Peak `json:"peaks"`
	// Penalty counts the requests denied by a penalty box alone; MaxWait
	// those max_wait held instead of refusing, MaxWaitLongest the longest
	// hold.
	Penalty        int64         `json:"penalty_changed"`
	MaxWait        int64         `json:"max_wait_changed"`
	MaxWaitLongest time.Duration `json:"max_wait_longest_ns"`
	Notes          []string      `json:"notes,omitempty"`

	top    int
	trees  map[string]*TreeStats
	sketch *topk.Sketch
	first  map[string]time.Time
	peaks  map[string]*Peak
	undec  map[string]int64
}

// Count is a reason and how often it happened.
type Count struct {
	Reason string `json:"reason"`
	Count  int64  `json:"count"`
}

// TreeStats are one tree's totals: requests its limits applied to, those
// admitted (by every tree), refused by it (mode enforce) and those it
// would have blocked (mode warn or shadow); per tier, the same, a denial
// counted at the tier that denied it.
type TreeStats struct {
	Handler string `json:"handler"`
	Tree    string `json:"tree"`
	Mode    string `json:"mode"`
	Counts
	Tiers []*TierStats `json:"tiers"`

	tiers map[string]*TierStats
}

// Counts are a tree's or a tier's totals.
type Counts struct {
	Requests   int64 `json:"requests"`
	Admitted   int64 `json:"admitted"`
	Refused    int64 `json:"refused"`
	WouldBlock int64 `json:"would_block"`
}

// TierStats are one tier's Counts.
type TierStats struct {
	Tier string `json:"tier"`
	Counts
}

// TopValue is a value denied often: how many times, and when first. With
// many values, Count may overestimate by up to Error (and First be later
// than the first denial).
type TopValue struct {
	Tree  string `json:"tree"`
	Tier  string `json:"tier"`
	Value string `json:"value"`
	// Missing is true for the requests refused for want of the tier's key
	// (its value empty).
	Missing bool      `json:"missing,omitempty"`
	Count   uint64    `json:"count"`
	Error   uint64    `json:"error,omitempty"`
	First   time.Time `json:"first"`
}

// Peak is the fullest a limit was: its share in use, of which value, when.
type Peak struct {
	Tree  string    `json:"tree"`
	Tier  string    `json:"tier"`
	Limit string    `json:"limit"`
	Share float64   `json:"share"`
	Value string    `json:"value"`
	At    time.Time `json:"at"`
}

func newReport(top int) *Report {
	return &Report{top: top, trees: map[string]*TreeStats{}, sketch: topk.New(max(top*10, 1000)),
		first: map[string]time.Time{}, peaks: map[string]*Peak{}, undec: map[string]int64{}}
}

// sep joins a key's parts: it is in no tree's or tier's name.
const sep = "\x00"

// reasonMissingKey is the engine's reason for a request refused for want
// of a tier's key.
const reasonMissingKey = "missing_key"

// add counts one request's outcome.
func (rep *Report) add(r *Request, o *Outcome) {
	rep.Requests++
	if rep.First.IsZero() {
		rep.First = r.Time
	}
	rep.Last = r.Time
	switch {
	case o.Undecided != "":
		rep.Undecided++
		rep.undec[o.Undecided]++
	case o.Refused:
		rep.Refused++
	case len(o.Trees) == 0:
		rep.Unlimited++
	default:
		rep.Admitted++
		if o.Denied() {
			rep.WouldBlock++
		}
	}
	for i := range o.Trees {
		rep.addTree(r, o, &o.Trees[i])
	}
}

func (rep *Report) addTree(r *Request, o *Outcome, t *TreeOutcome) {
	key := t.Handler + sep + t.Tree
	ts := rep.trees[key]
	if ts == nil {
		ts = &TreeStats{Handler: t.Handler, Tree: t.Tree, Mode: t.Mode, tiers: map[string]*TierStats{}}
		rep.trees[key] = ts
		rep.Trees = append(rep.Trees, ts)
	}
	admitted := !o.Refused && o.Undecided == ""
	count := func(c *Counts, denied bool) {
		c.Requests++
		if admitted {
			c.Admitted++
		}
		if denied {
			if t.Mode == "enforce" {
				c.Refused++
			} else {
				c.WouldBlock++
			}
		}
	}
	count(&ts.Counts, t.Denied)
	for _, tier := range t.Tiers {
		tst := ts.tiers[tier]
		if tst == nil {
			tst = &TierStats{Tier: tier}
			ts.tiers[tier] = tst
			ts.Tiers = append(ts.Tiers, tst)
		}
		count(&tst.Counts, t.Denied && t.Tier == tier)
	}
	if t.Denied && t.Tier != "" {
		vk := t.Tree + sep + t.Tier + sep + "v" + clip(t.Value)
		if t.Reason == reasonMissingKey {
			vk = t.Tree + sep + t.Tier + sep + "m"
		}
		rep.sketch.Add(vk, 1)
		if _, ok := rep.first[vk]; !ok {
			rep.first[vk] = r.Time
			if len(rep.first) > 4*max(rep.top*10, 1000) {
				rep.pruneFirst()
			}
		}
	}
	if t.Penalty {
		rep.Penalty++
	}
	if t.Wait > 0 {
		rep.MaxWait++
		rep.MaxWaitLongest = max(rep.MaxWaitLongest, t.Wait)
	}
	for _, u := range t.Usage {
		pk := t.Tree + sep + u.Tier + sep + u.Limit
		p := rep.peaks[pk]
		if p == nil {
			p = &Peak{Tree: t.Tree, Tier: u.Tier, Limit: u.Limit, Share: -1}
			rep.peaks[pk] = p
		}
		if u.Share > p.Share {
			p.Share, p.Value, p.At = u.Share, clip(u.Value), r.Time
		}
	}
}

// maxValue bounds the length of a value the report keeps: a log's values
// are the clients' (a megabyte header), and the report holds thousands.
const maxValue = 256

// clip returns v, or when it is longer than maxValue its start, its
// length and a hash of it (two long values are told apart).
func clip(v string) string {
	if len(v) <= maxValue {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return fmt.Sprintf("%s… (%d bytes, sha256 %x)", strings.ToValidUTF8(v[:maxValue-64], ""), len(v), sum[:8])
}

// pruneFirst keeps the first denial times of the values still in the
// sketch only.
func (rep *Report) pruneFirst() {
	keep := make(map[string]time.Time, len(rep.first)/2)
	for _, e := range rep.sketch.Top(0) {
		if t, ok := rep.first[e.Key]; ok {
			keep[e.Key] = t
		}
	}
	rep.first = keep
}

// finish orders the report's lists (empty, never null, in JSON).
func (rep *Report) finish() {
	if rep.Trees == nil {
		rep.Trees = []*TreeStats{}
	}
	rep.TopRefused, rep.Peaks = []TopValue{}, []Peak{}
	for _, e := range rep.sketch.Top(rep.top) {
		parts := strings.SplitN(e.Key, sep, 3)
		rep.TopRefused = append(rep.TopRefused, TopValue{Tree: parts[0], Tier: parts[1], Value: parts[2][1:], Missing: parts[2] == "m",
			Count: e.Count, Error: e.Error, First: rep.first[e.Key]})
	}
	for _, p := range rep.peaks {
		rep.Peaks = append(rep.Peaks, *p)
	}
	slices.SortFunc(rep.Peaks, func(a, b Peak) int {
		return cmp.Or(cmp.Compare(b.Share, a.Share), cmp.Compare(a.Tree, b.Tree), cmp.Compare(a.Tier, b.Tier), cmp.Compare(a.Limit, b.Limit))
	})
	for reason, n := range rep.undec {
		rep.UndecidedBy = append(rep.UndecidedBy, Count{Reason: reason, Count: n})
	}
	slices.SortFunc(rep.UndecidedBy, func(a, b Count) int { return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Reason, b.Reason)) })
}

// Diff is where two configurations' limits disagreed: the requests the
// configuration denied and the --against one did not (New), and the
// reverse (Old). A request counts as denied whatever its tree's mode.
type Diff struct {
	DeniedByNew int64     `json:"denied_by_new_only"`
	DeniedByOld int64     `json:"denied_by_old_only"`
	NewExamples []Example `json:"new_examples,omitempty"`
	OldExamples []Example `json:"old_examples,omitempty"`
	top         int
}

// Example is one request the two configurations decided differently.
type Example struct {
	Time   time.Time `json:"time"`
	File   string    `json:"file"`
	Line   int64     `json:"line"`
	Method string    `json:"method"`
	// Path is the request's path, without its query (which may hold a
	// credential).
	Path string `json:"path"`
	// Tree, Tier and Value are what denied it; Missing is true when it
	// was refused for want of the tier's key.
	Tree    string `json:"tree"`
	Tier    string `json:"tier"`
	Value   string `json:"value"`
	Missing bool   `json:"missing,omitempty"`
}

func newDiff(top int) *Diff { return &Diff{top: top} }

func (d *Diff) add(r *Request, n, o *Outcome) {
	dn, do := n.Denied(), o.Denied()
	switch {
	case dn && !do:
		d.DeniedByNew++
		if len(d.NewExamples) < d.top {
			d.NewExamples = append(d.NewExamples, exampleOf(r, n))
		}
	case do && !dn:
		d.DeniedByOld++
		if len(d.OldExamples) < d.top {
			d.OldExamples = append(d.OldExamples, exampleOf(r, o))
		}
	}
}

func exampleOf(r *Request, o *Outcome) Example {
	path, _, _ := strings.Cut(r.URI, "?")
	e := Example{Time: r.Time, File: r.File, Line: r.Line, Method: r.Method, Path: path}
	for _, t := range o.Trees {
		if t.Denied {
			e.Tree, e.Tier, e.Value, e.Missing = t.Tree, t.Tier, clip(t.Value), t.Reason == reasonMissingKey
			break
		}
	}
	if e.Tree == "" && o.Undecided != "" {
		e.Tier = o.Undecided
	}
	return e
}
