package lease

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"slices"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/store"
)

// A reset (the admin API's) wipes buckets in the store, and the charges of
// every lease on them with it: this instance revokes its own leases on
// them (reset), but the other instances sharing the store would go on
// spending theirs — capacity no longer charged anywhere — until each runs
// out or ends (TTL). So each reset is told to the other instances' Stores
// over a Link (store.Bus), and they revoke their leases on those buckets
// when it arrives (giving back what those leases hold on the path's other
// buckets): what a reset bucket may admit beyond its fresh capacity is
// then what other instances spend in the moment the message takes, not in
// a lease's TTL. A grant in flight on a path with a reset bucket when it
// arrives is not installed (its charge may have been wiped). A message
// lost (Redis away between the reset and its publishing) leaves the old
// bound: the TTL.

// Link carries a Store's messages to the Stores of the other instances
// sharing its store, without waiting (store.Bus).
type Link interface {
	Publish(msg []byte) bool
	Close() error
}

// resetMessage says that buckets were reset: Keys, or every bucket the
// pattern Glob selected (a Redis glob, store.GlobMatch: the one the store's
// SCAN used, of which the resetting instance's exact selection is a
// subset — so another instance may revoke a little more, never less).
type resetMessage struct {
	From string   `json:"f"`
	Keys []string `json:"keys,omitempty"`
	Glob string   `json:"glob,omitempty"`
}

// encodeReset is the message from the instance from saying that keys, or
// the buckets glob selects, were reset; nil when nothing was.
func encodeReset(from string, keys []string, glob string) []byte {
	if glob == "" && len(keys) == 0 {
		return nil
	}
	b, _ := json.Marshal(resetMessage{From: from, Keys: keys, Glob: glob}) // strings: cannot fail
	return b
}

// peers is a Store's link to the other instances (guarded by its mutex).
type peers struct {
	self string
	link Link
}

// Connect links s to the other instances sharing its store: from now on
// its resets are told to them, and theirs (Receive) revoke its leases.
func (s *Store) Connect(l Link) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	s.peers = peers{self: rand.Text(), link: l}
}

// announceReset tells the other instances that keys, or the buckets glob
// selects, were reset.
func (s *Store) announceReset(keys []string, glob string) {
	s.peersMu.Lock()
	p := s.peers
	s.peersMu.Unlock()
	if p.link == nil {
		return
	}
	if b := encodeReset(p.self, keys, glob); b != nil {
		p.link.Publish(b)
	}
}

// TellResets makes r, a Redis store this instance uses without leases,
// tell the lease Stores of the other instances sharing it of its resets on
// the channel name (as a Store with leases tells them, see Connect), so
// that their leases on the reset buckets end at once, not at their TTL.
// A message that cannot be published is logged.
func TellResets(r *store.Redis, name string, logger *zap.Logger) {
	self := "reset:" + rand.Text()
	r.SetOnReset(func(keys []string, glob string) {
		b := encodeReset(self, keys, glob)
		if b == nil {
			return
		}
		if err := r.PublishOnce(context.Background(), name, b); err != nil {
			logger.Warn("rate limit: a reset could not be told to the other instances: their leases on the reset buckets, if any, run to their ttl",
				zap.Error(err))
		}
	})
}

// Receive takes a message from the Link: another instance's reset revokes
// this instance's leases on the reset buckets. Its own messages, and
// malformed ones, are ignored.
func (s *Store) Receive(msg []byte) {
	var m resetMessage
	if json.Unmarshal(msg, &m) != nil || m.From == "" || m.Glob == "" && len(m.Keys) == 0 {
		return
	}
	s.peersMu.Lock()
	self := s.peers.self
	s.peersMu.Unlock()
	if m.From == self {
		return
	}
	selected := func(k string) bool { return store.GlobMatch(m.Glob, k) }
	if m.Glob == "" {
		slices.Sort(m.Keys)
		selected = func(k string) bool { _, found := slices.BinarySearch(m.Keys, k); return found }
	}
	// As around this instance's own resets: a grant in flight now on a
	// path with a reset bucket is not installed, and leases installed
	// before are revoked.
	s.bump(selected)
	s.revoke(selected)
	s.bump(selected)
	s.stats.peerResets.Add(1)
}
