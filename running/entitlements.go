package running

import (
	"slices"
	"sync"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/entitle"
)

// Entitlements describes one entitlements block of a handler, for the
// admin API: which names it accepts runtime entitlements for, in which
// store (its engine's), and how it shows their values.
type Entitlements struct {
	// Name is the block's name, as the configuration gives it.
	Name string
	// Tree and Tier name the tier whose value the block looks up: a
	// value is shown as that tier's are (as a fingerprint when the tier
	// is sensitive).
	Tree, Tier string
	// Plans are the plans the handler's trees know. When set, the admin
	// API refuses a runtime entitlement to any other plan; nil accepts
	// any.
	Plans []string
	// Stats are the block's cache's counters, for metrics (nil: none).
	Stats func() entitle.Stats
}

// blocks holds the entitlements blocks registered, by engine.
var blocks = struct {
	sync.Mutex
	of map[*engine.Engine][]Entitlements
}{of: map[*engine.Engine][]Entitlements{}}

// RegisterEntitlements records the entitlements blocks of the handler
// whose engine is e, replacing any recorded for e, until the returned
// function is called. Call it beside Register, and unregister when the
// handler is cleaned up (as Register's): only the blocks of engines that
// Engines returns are consulted, but the record keeps e until then.
func RegisterEntitlements(e *engine.Engine, bs ...Entitlements) (unregister func()) {
	bs = slices.Clone(bs)
	blocks.Lock()
	blocks.of[e] = bs
	blocks.Unlock()
	return func() {
		blocks.Lock()
		delete(blocks.of, e)
		blocks.Unlock()
	}
}

// EntitlementsOf returns the entitlements blocks registered for e (nil
// when none). The caller must not modify them.
func EntitlementsOf(e *engine.Engine) []Entitlements {
	blocks.Lock()
	defer blocks.Unlock()
	return blocks.of[e]
}
