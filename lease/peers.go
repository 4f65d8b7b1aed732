package lease

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/caddy-cascade/cascade/logsample"
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

// The bounds of a reset message (decodeReset). A message is anyone's who
// may publish on the channel (but see store.BusKey), and its keys and glob
// are matched against every lease of this instance under its locks, so
// each is bounded: the keys and globs Cascade makes are far shorter.
const (
	maxFrom      = 64   // rand.Text() is 26
	maxResetKeys = 1024 // per message; a longer list is sent in several
	maxResetKey  = 4096 // bytes, a key or a glob
)

// errMalformed is why a message was not taken.
var errMalformed = errors.New("malformed reset message")

// decodeReset is the reset message b, or errMalformed (wrapped with the
// reason): a From, and either Keys or a Glob of the shape Cascade's resets
// by pattern have (validResetGlob), within the bounds above.
func decodeReset(b []byte) (resetMessage, error) {
	var m resetMessage
	if len(b) > store.MaxBusMessage {
		return m, fmt.Errorf("%w: %d bytes, more than %d", errMalformed, len(b), store.MaxBusMessage)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %w", errMalformed, err)
	}
	switch {
	case m.From == "" || len(m.From) > maxFrom:
		return m, fmt.Errorf("%w: a sender of %d bytes (1 to %d)", errMalformed, len(m.From), maxFrom)
	case m.Glob == "" && len(m.Keys) == 0:
		return m, fmt.Errorf("%w: neither keys nor a glob", errMalformed)
	case m.Glob != "" && len(m.Keys) > 0:
		return m, fmt.Errorf("%w: both keys and a glob", errMalformed)
	case len(m.Keys) > maxResetKeys:
		return m, fmt.Errorf("%w: %d keys, more than %d", errMalformed, len(m.Keys), maxResetKeys)
	case m.Glob != "" && !validResetGlob(m.Glob):
		return m, fmt.Errorf("%w: a glob (%d bytes) not of the form {<tree>|*}<path>[#/]*", errMalformed, len(m.Glob))
	}
	for _, k := range m.Keys {
		if k == "" || len(k) > maxResetKey {
			return m, fmt.Errorf("%w: a key of %d bytes (1 to %d)", errMalformed, len(k), maxResetKey)
		}
	}
	return m, nil
}

// validResetGlob reports whether glob has the shape of the globs of
// Cascade's resets by pattern (hierarchy.Tree.Subtree), {<tree>|*}<path>[#/]*
// with no other glob character nor brace, within maxResetKey bytes. Any
// glob matches in linear time (store.GlobMatch), but a peer's glob is
// matched against every key leased here, under the leases' locks: of this
// shape, the literal '}' after its one inner * anchors the match (a key
// has one '}'), so each key costs O(len(key)+len(glob)) steps, not their
// product. A reset by another pattern is not told (see announceReset).
func validResetGlob(glob string) bool {
	const tail = "[#/]*"
	if len(glob) > maxResetKey || !strings.HasPrefix(glob, "{") || !strings.HasSuffix(glob, tail) {
		return false
	}
	tree, path, ok := strings.Cut(glob[1:len(glob)-len(tail)], "|*}")
	return ok && tree != "" && !strings.ContainsAny(tree, "*?[]\\{}") && !strings.ContainsAny(path, "*?[]\\{}")
}

// encodeReset is the messages from the instance from saying that keys, or
// the buckets glob selects, were reset: none when nothing was, or when
// its peers would refuse them (a glob of another shape, a key too long:
// their leases there run to their TTL); keys are split among messages
// of at most maxResetKeys keys and store.MaxBusMessage bytes.
func encodeReset(from string, keys []string, glob string) [][]byte {
	if glob != "" {
		if !validResetGlob(glob) {
			return nil
		}
		b, _ := json.Marshal(resetMessage{From: from, Glob: glob}) // strings: cannot fail
		return [][]byte{b}
	}
	keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == "" || len(k) > maxResetKey })
	var out [][]byte
	var split func(keys []string)
	split = func(keys []string) {
		if len(keys) == 0 {
			return
		}
		b, _ := json.Marshal(resetMessage{From: from, Keys: keys})
		if len(keys) > 1 && (len(keys) > maxResetKeys || len(b) > store.MaxBusMessage) {
			split(keys[:len(keys)/2])
			split(keys[len(keys)/2:])
			return
		}
		if len(b) <= store.MaxBusMessage {
			out = append(out, b)
		}
	}
	split(keys)
	return out
}

// peers is a Store's link to the other instances (guarded by its mutex,
// but for the counter).
type peers struct {
	self string
	link Link
	// rejected counts the messages heard and refused (decodeReset);
	// sampled logs them, one line per reason a minute.
	rejected atomic.Int64
	sampled  *logsample.Sampler
}

// Connect links s to the other instances sharing its store: from now on
// its resets are told to them, and theirs (Receive) revoke its leases.
func (s *Store) Connect(l Link) {
	s.peersMu.Lock()
	defer s.peersMu.Unlock()
	s.peers.self, s.peers.link = rand.Text(), l
}

// PeerRejected is how many messages from the Link Receive refused as
// malformed (see decodeReset): another process publishes on the channel.
func (s *Store) PeerRejected() int64 { return s.peers.rejected.Load() }

// announceReset tells the other instances that keys, or the buckets glob
// selects, were reset.
func (s *Store) announceReset(keys []string, glob string) {
	s.peersMu.Lock()
	self, link := s.peers.self, s.peers.link
	s.peersMu.Unlock()
	if link == nil {
		return
	}
	for _, b := range encodeReset(self, keys, glob) {
		link.Publish(b)
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
		for _, b := range encodeReset(self, keys, glob) {
			if err := r.PublishOnce(context.Background(), name, b); err != nil {
				logger.Warn("rate limit: a reset could not be told to the other instances: their leases on the reset buckets, if any, run to their ttl",
					zap.Error(err))
			}
		}
	})
}

// Receive takes a message from the Link: another instance's reset revokes
// this instance's leases on the reset buckets. Its own messages are
// ignored; malformed ones (decodeReset) are counted (PeerRejected), logged
// and ignored.
func (s *Store) Receive(msg []byte) {
	m, err := decodeReset(msg)
	if err != nil {
		s.reject(err, len(msg))
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

// reject counts a message refused, and logs the first of each reason a
// minute (never the message: anyone who may publish wrote it).
func (s *Store) reject(err error, size int) {
	n := s.peers.rejected.Add(1)
	s.peersMu.Lock()
	if s.peers.sampled == nil {
		s.peers.sampled = logsample.New(time.Minute, 8)
	}
	sampled := s.peers.sampled
	s.peersMu.Unlock()
	if s.opts.Logger == nil {
		return
	}
	if ok, _ := sampled.Allow(err.Error(), time.Now()); ok {
		s.opts.Logger.Warn("rate limit: a message on the channel of lease resets was refused (another process publishes on it?)",
			zap.Int("bytes", size), zap.Int64("rejected_total", n), zap.Error(err))
	}
}
