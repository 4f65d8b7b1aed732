package store

import "time"

// SetQuiet sets how long b may hear nothing before it pings itself.
func (b *Bus) SetQuiet(d time.Duration) { b.quiet.Store(int64(d)) }

// GlobMatchSteps is GlobMatch, and how many steps it took.
func GlobMatchSteps(pattern, key string) (bool, int) { return globMatch(pattern, key) }

// BusCodec seals messages as a Bus of a store with key does on channel,
// and opens them as a Bus hearing them does.
type BusCodec struct {
	state *busState
	open  *opener
}

// NewBusCodec returns the codec of key (nil: unsigned) on channel.
func NewBusCodec(key []byte, channel string) *BusCodec {
	s := &busState{key: key, now: time.Now}
	copy(s.sender[:], "test-sender-0001")
	return &BusCodec{state: s, open: newOpener(s, channel)}
}

// SetClock sets the clock the codec seals and opens by.
func (c *BusCodec) SetClock(now func() time.Time) { c.state.now = now }

// Seal is msg as published.
func (c *BusCodec) Seal(msg []byte) []byte { return c.state.seal(c.open.channel, msg) }

// Open is the payload of msg heard, or why it is dropped.
func (c *BusCodec) Open(msg []byte) ([]byte, error) { return c.open.open(msg) }

// ErrBusReplayed is why a message heard before, or stale, is dropped.
var ErrBusReplayed = errBusReplayed
