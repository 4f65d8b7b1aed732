package hierarchy

import (
	"fmt"
	"time"
)

// Penalty puts a value of a tier that keeps being refused in a penalty
// box: once the tier's limits have refused it After times within Within,
// every request of that value is refused for For, with a Retry-After of
// what is left of it, however much its limits have refilled.
//
// The box is a bucket of its own on the value's path, charged nothing: a
// GCRA limit of 1 per For, which a debt of BoxDebt fills for exactly For. The strikes are counted in another, charged only when the
// tier refuses: After per Within. Both are keyed beside the value's limits,
// so resetting the value resets them too.
type Penalty struct {
	// For is how long a value in the box is refused, e.g. "10m".
	For string `json:"for"`
	// After is how many refusals by the tier's limits put a value in the
	// box (at least 1).
	After int64 `json:"after"`
	// Within is the window in which those refusals count; default For.
	Within string `json:"within,omitempty"`

	box, strikes *Limit
}

// penalty dimensions: neither is a cost a request is charged in.
const (
	penaltyBox     = "penalty"
	penaltyStrikes = "strikes"
)

func (p *Penalty) compile(tier string) error {
	d, err := time.ParseDuration(p.For)
	if err != nil || d < time.Second {
		return fmt.Errorf("penalty %q: give how long a value is refused, at least a second, e.g. penalty 10m after 5", p.For)
	}
	if p.After < 1 {
		return fmt.Errorf("penalty %s after %d: give how many refusals put a value in the box, at least 1", p.For, p.After)
	}
	within := p.For
	if p.Within != "" {
		w, err := time.ParseDuration(p.Within)
		if err != nil || w < time.Second {
			return fmt.Errorf("penalty within %q: give the window refusals count in, at least a second, e.g. within 1m", p.Within)
		}
		within = p.Within
	}
	p.box = &Limit{Count: 1, Per: p.For, Dimension: penaltyBox, Algorithm: "gcra"}
	p.strikes = &Limit{Count: p.After, Per: within, Dimension: penaltyStrikes, Algorithm: "gcra"}
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

// Penalty returns the penalty whose box the limit is, or nil for a limit.
func (l *Limit) Penalty() *Penalty { return l.penalty }

// Strikes returns the bucket counting the refusals of box's value (box is
// the penalty box bucket of a path, whose Limit.Penalty is not nil): its
// key and limit.
func (b Bucket) Strikes() (key string, limit *Limit) {
	p := b.Limit.penalty
	return b.Key[:len(b.Key)-len(p.box.id)] + p.strikes.id, p.strikes
}

// BoxDebt is what puts a value in its penalty box: a debt of 2 on the
// box's limit of 1 per For refuses every request (charged nothing there)
// for exactly For.
const BoxDebt = 2
