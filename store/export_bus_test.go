package store

import "time"

// SetQuiet sets how long b may hear nothing before it pings itself.
func (b *Bus) SetQuiet(d time.Duration) { b.quiet.Store(int64(d)) }
