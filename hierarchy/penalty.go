package hierarchy

import (
	"fmt"
	"strings"
	"time"

	"github.com/caddy-cascade/cascade/rate"
)

// Penalty puts a value of a tier that keeps being refused in a penalty
// box: once the tier's limits have refused it After times within Within,
// every request of that value is refused for For, with a Retry-After of
// what is left of it, however much its limits have refilled.
//
// The box is a bucket of its own on the value's path, charged nothing: a
// GCRA limit of boxScale per For, which Debt fills to twice its capacity,
// so that it refuses for exactly For (boxScale is large so that a box
// refilled in part is topped up to the µs). The strikes are another
// bucket, charged only when the tier's limits refuse: an exact sliding
// window of After per Within, so the After-th refusal within any Within
// boxes. Both are keyed beside the value's limits, so resetting the value
// resets them too.
type Penalty struct {
	// For is how long a value in the box is refused, e.g. "10m".
	For string `json:"for"`
	// After is how many refusals by the tier's limits put a value in the
	// box (at least 1).
	After int64 `json:"after"`
	// Within is the window in which those refusals count; default For.
	Within string `json:"within,omitempty"`

	duration     time.Duration
	box, strikes *Limit
}

// penalty dimensions: neither is a cost a request is charged in.
const (
	penaltyBox     = "penalty"
	penaltyStrikes = "strikes"
	boxScale       = 1 << 20
)

// parsePenaltyDuration reads a penalty's durations as limits' periods are
// read (10m, 1h, 1d, day), at least a second.
func parsePenaltyDuration(s string) (time.Duration, bool) {
	d, unit, err := rate.ParsePer(s)
	return d, err == nil && unit == "" && d >= time.Second
}

func (p *Penalty) compile(tier string) error {
	d, ok := parsePenaltyDuration(p.For)
	if !ok {
		return fmt.Errorf("penalty %q: give how long a value is refused, at least a second, e.g. penalty 10m after 5", p.For)
	}
	if p.After < 1 {
		return fmt.Errorf("penalty %s after %d: give how many refusals put a value in the box, at least 1", p.For, p.After)
	}
	within := p.For
	if p.Within != "" {
		if _, ok := parsePenaltyDuration(p.Within); !ok {
			return fmt.Errorf("penalty within %q: give the window refusals count in, at least a second, e.g. within 1m", p.Within)
		}
		within = p.Within
	}
	p.duration = d
	p.box = &Limit{Count: boxScale, Per: p.For, Dimension: penaltyBox, Algorithm: string(rate.GCRA)}
	p.strikes = &Limit{Count: p.After, Per: within, Dimension: penaltyStrikes, Algorithm: string(rate.Sliding)}
	for _, l := range []*Limit{p.box, p.strikes} {
		if err := l.compile(); err != nil {
			return fmt.Errorf("penalty: %w", err)
		}
	}
	p.box.name = tier + ".penalty"
	p.box.policy = p.box.name
	p.box.penalty = p
	return nil
}

// Validate checks the penalty on its own, without changing it, so a config
// parser can report it at the line that wrote it.
func (p Penalty) Validate() error { return p.compile("") }

// Duration is how long a value in the box is refused.
func (p *Penalty) Duration() time.Duration { return p.duration }

// Debt is what puts a value in its box, given what its box had left
// (the box's Remaining in the decision that counted the last strike): it
// fills the box to twice its capacity, so that it refuses every request
// for For from now, however full it was.
func (p *Penalty) Debt(remaining int64) int64 { return boxScale + remaining }

// Penalty returns the penalty whose box the limit is, or nil for a limit.
func (l *Limit) Penalty() *Penalty { return l.penalty }

// Strikes returns the bucket counting the refusals of box's value (box is
// the penalty box bucket of a path, whose Limit.Penalty is not nil): its
// key and limit.
func (b Bucket) Strikes() (key string, limit *Limit) {
	p := b.Limit.penalty
	return b.Key[:len(b.Key)-len(p.box.id)] + p.strikes.id, p.strikes
}

// SameValue reports whether buckets a and o are of one value on one path:
// their keys are the same but for the limit.
func (b Bucket) SameValue(o Bucket) bool {
	i, j := strings.LastIndexByte(b.Key, '#'), strings.LastIndexByte(o.Key, '#')
	return i >= 0 && i == j && b.Key[:i] == o.Key[:j]
}

// Reserved reports whether dimension d is a penalty box's, which no limit
// or cost may count in.
func Reserved(d string) bool { return d == penaltyBox || d == penaltyStrikes }
