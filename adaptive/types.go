package adaptive

import (
	"fmt"
	"math"
)

// Priority is a traffic class. At the same health, lower priorities are
// scaled down first: with the controller's factor f in [Floor, 1],
//
//	critical     gets √f
//	interactive  gets f        (the default)
//	batch        gets max(f², Floor)
//
// All classes get 1 while the system is healthy. As f falls, batch loses
// capacity twice as fast in relative terms (d ln f² = 2 d ln f) and reaches
// the floor first, when f = √Floor (0.32 with the default floor), while
// interactive traffic still has a third of its limit; critical traffic keeps
// more than interactive all the way down (√0.1 ≈ 0.32 at the floor). A power
// law keeps the ordering at every level with no extra parameter, and the
// classes still move together, so the controller's stability carries over.
//
// The zero Priority is PriorityInteractive. Priority marshals to and from
// its name ("critical", "interactive", "batch") in JSON.
type Priority uint8

// The traffic classes.
const (
	PriorityInteractive Priority = iota
	PriorityBatch
	PriorityCritical
	numPriorities
)

// ParsePriority parses a priority name; the empty string is interactive.
func ParsePriority(s string) (Priority, error) {
	switch s {
	case "", "interactive":
		return PriorityInteractive, nil
	case "batch":
		return PriorityBatch, nil
	case "critical":
		return PriorityCritical, nil
	}
	return 0, fmt.Errorf("adaptive: unknown priority %q (want critical, interactive or batch)", s)
}

func (p Priority) String() string {
	switch p {
	case PriorityInteractive:
		return "interactive"
	case PriorityBatch:
		return "batch"
	case PriorityCritical:
		return "critical"
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// MarshalText implements encoding.TextMarshaler.
func (p Priority) MarshalText() ([]byte, error) {
	if p >= numPriorities {
		return nil, fmt.Errorf("adaptive: invalid priority %d", uint8(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (p *Priority) UnmarshalText(b []byte) error {
	v, err := ParsePriority(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// classFactor is the factor of class p when the controller's factor is f.
func classFactor(p Priority, f, floor float64) float64 {
	switch p {
	case PriorityBatch:
		return max(f*f, floor)
	case PriorityCritical:
		return math.Sqrt(f)
	}
	return f
}

// Level summarises the controller's state for logs, metrics and callers that
// answer differently under stress. Levels are ordered: a greater Level is
// worse.
type Level int32

// The levels.
const (
	// LevelHealthy: no signal has crossed warn, or every signal has been
	// back below warn·(1 − Hysteresis) for RecoveryDelay. The factor is 1,
	// or climbing back to it.
	LevelHealthy Level = iota
	// LevelWarn: the worst signal crossed warn (and has not clearly fallen
	// back): the factor falls while it stays above warn, gently near warn,
	// faster towards critical.
	LevelWarn
	// LevelCritical: a signal crossed critical: the factor halves (Backoff)
	// every second it stays there.
	LevelCritical
	// LevelFloor: the effective factor is at Config.Floor, whatever the
	// reason (local signals or a shared factor).
	LevelFloor
)

func (l Level) String() string {
	switch l {
	case LevelHealthy:
		return "healthy"
	case LevelWarn:
		return "warn"
	case LevelCritical:
		return "critical"
	case LevelFloor:
		return "floor"
	}
	return fmt.Sprintf("Level(%d)", int32(l))
}

// MarshalText implements encoding.TextMarshaler.
func (l Level) MarshalText() ([]byte, error) { return []byte(l.String()), nil }
