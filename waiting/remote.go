package waiting

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// Processes sharing a store (Caddy instances on one Redis) share its
// buckets, so priority must hold between them too: a batch request held by
// one instance must give way to an interactive request another instance
// holds, or is deciding, on the same buckets. Each connected Registry
// tells the others, over a Link, what it holds:
//
//	hold     an entry is held (or, pending, being decided) on keys for d
//	leave    it no longer is
//	preempt  an interactive entry preempts the batch entries on keys
//	gaveback a process's batch entries so preempted gave their
//	         reservations back (to the preempting process)
//
// and keeps what the others told it (remoteState): their interactive
// entries make its batch requests yield (busy), their batch entries are
// the peers an interactive request preempts along with its own (Preempt,
// Hold), waiting for their gaveback before it is decided again.
//
// A Link may lose messages (Redis away, a receiver reconnecting) and
// delivers them a moment late, so what a process heard expires by itself:
// an entry at the end of its d, a preemption after remoteAckTimeout. A
// message lost or late can let one batch request go ahead of an
// interactive one on another process (as if the two were decided a
// moment apart); it never holds a request longer than its own wait, and
// never charges or refunds anything (each process gives back only what
// its own requests reserved).

// Link carries a Registry's messages to the Registries of the other
// processes sharing its store, in order and without waiting
// (store.Bus); every process's messages reach Receive.
type Link interface {
	// Publish queues msg, and reports whether it could.
	Publish(msg []byte) bool
	Close() error
}

// remoteAckTimeout is the longest an interactive request waits for other
// processes to say their preempted batch requests gave their reservations
// back: a process that went away, or a message lost, costs it this much.
const remoteAckTimeout = time.Second

// maxRemoteFor bounds how long another process's entry is believed held
// (message.For): a peer's bug, or a foreign publisher on the channel, can
// make batch requests here yield for no longer than this.
const maxRemoteFor = time.Hour

// The bounds of a message from another process (decodeMessage): what a
// Registry keeps of them is bounded too (maxRemote). A message is
// anyone's who may publish on the channel (but see store.BusKey).
const (
	maxMessage = 64 << 10 // bytes, store.MaxBusMessage
	maxFrom    = 64       // a process's name (rand.Text() is 26)
	maxKeys    = 256      // an entry's keys: a path's buckets
	maxKey     = 4096     // bytes
	// maxRemote bounds the entries of other processes kept: beyond it a
	// hold is refused (counted), as if lost.
	maxRemote = 100_000
)

// errMalformed is why a message was refused.
var errMalformed = errors.New("malformed message")

// decodeMessage is the message b, or errMalformed (wrapped with the
// reason): a known kind from a named process, with keys and a duration
// within the bounds above (For is then clamped to maxRemoteFor).
func decodeMessage(b []byte) (message, error) {
	var m message
	if len(b) > maxMessage {
		return m, fmt.Errorf("%w: %d bytes, more than %d", errMalformed, len(b), maxMessage)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: %w", errMalformed, err)
	}
	switch {
	case m.Kind != "hold" && m.Kind != "leave" && m.Kind != "preempt" && m.Kind != "gaveback":
		return m, fmt.Errorf("%w: unknown kind (%d bytes)", errMalformed, len(m.Kind))
	case m.From == "" || len(m.From) > maxFrom:
		return m, fmt.Errorf("%w: a sender of %d bytes (1 to %d)", errMalformed, len(m.From), maxFrom)
	case m.Kind == "gaveback" && (m.To == "" || len(m.To) > maxFrom):
		return m, fmt.Errorf("%w: gaveback to a process of %d bytes (1 to %d)", errMalformed, len(m.To), maxFrom)
	case len(m.Keys) > maxKeys:
		return m, fmt.Errorf("%w: %d keys, more than %d", errMalformed, len(m.Keys), maxKeys)
	case m.For < 0:
		return m, fmt.Errorf("%w: a negative duration", errMalformed)
	}
	for _, k := range m.Keys {
		if k == "" || len(k) > maxKey {
			return m, fmt.Errorf("%w: a key of %d bytes (1 to %d)", errMalformed, len(k), maxKey)
		}
	}
	m.For = min(m.For, int64(maxRemoteFor))
	return m, nil
}

// pruneEvery is how often, at most, a Registry forgets the expired entries
// of other processes when it finds them in its way.
const pruneEvery = 100 * time.Millisecond

// message is what Registries tell each other.
type message struct {
	Kind  string `json:"k"`           // hold, leave, preempt, gaveback
	From  string `json:"f"`           // the sender
	ID    uint64 `json:"i"`           // the sender's entry (gaveback: the preempting entry)
	To    string `json:"t,omitempty"` // gaveback: the preempting process
	Batch bool   `json:"b,omitempty"` // hold: a batch entry
	// Pending is, for preempt, whether the preempting entry is still to
	// be decided (Preempt): only then do the preempted entries' Retry wait
	// for its decision (its next hold or leave).
	Pending bool `json:"p,omitempty"`
	// Seq names, for preempt and gaveback, one preemption of the entry
	// (an entry preempts again when it is held): a late answer to an
	// earlier one does not count for the next.
	Seq  uint64   `json:"s,omitempty"`
	Keys []string `json:"keys,omitempty"`
	// For is, for hold and preempt, how long from sending the entry
	// may be held at the latest (ns): a duration, not a time, so that
	// clocks of different hosts need not agree.
	For int64 `json:"d,omitempty"`
}

// remoteID names an entry of another process.
type remoteID struct {
	from string
	id   uint64
}

// remoteEntry is an entry another process holds.
type remoteEntry struct {
	batch bool
	keys  []string
	until time.Time // by this process's clock
}

// preemption is an interactive entry's preemption of other processes'
// batch entries: done (the victim standing for them all) closes when each
// of peers said they gave back.
type preemption struct {
	seq    uint64
	peers  map[string]bool
	victim *Entry
}

// remoteState is what a Registry knows of the other processes (guarded
// by Registry.mu, but for remoteBatches).
type remoteState struct {
	self          string // this process's name on the Link
	link          Link
	now           func() time.Time
	remote        map[remoteID]*remoteEntry
	byKey         map[string]map[remoteID]*remoteEntry
	remoteBatches atomic.Int64 // batch entries in remote, expired or not
	preemptions   map[uint64]*preemption
	preemptSeq    uint64
	lastPrune     time.Time
	// awaiting are the pending entries of other processes that preempted
	// batch entries here, until their request is decided (its hold or
	// leave arrives): the preempted entries' Retry waits for that.
	awaiting   map[remoteID]*Entry
	received   int
	ackTimeout time.Duration // remoteAckTimeout, but in tests
	// rejected counts the messages refused: malformed (decodeMessage), or
	// a hold beyond maxRemote.
	rejected  atomic.Int64
	maxRemote int // maxRemote, but in tests
}

func (s *remoteState) init() {
	s.self = rand.Text()
	s.now = time.Now
	s.remote = map[remoteID]*remoteEntry{}
	s.byKey = map[string]map[remoteID]*remoteEntry{}
	s.preemptions = map[uint64]*preemption{}
	s.awaiting = map[remoteID]*Entry{}
	s.ackTimeout = remoteAckTimeout
	s.maxRemote = maxRemote
}

// Connect links r to the other processes sharing its store: from now on
// it tells them what it holds, and hears (Receive) what they hold. Give
// Receive to the Link before Connect: messages heard before are kept.
func (r *Registry) Connect(l Link) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.link = l
}

// publish sends m (r.mu held), if r is connected.
func (r *Registry) publish(m message) {
	if r.link == nil {
		return
	}
	m.From = r.self
	b, err := json.Marshal(m)
	if err != nil {
		return // a message of strings and numbers always encodes
	}
	r.link.Publish(b)
}

// announce tells the other processes that e is held (r.mu held).
func (r *Registry) announce(e *Entry) {
	if r.link == nil {
		return
	}
	r.publish(message{Kind: "hold", ID: e.id, Batch: e.batch, Keys: e.keys, For: r.heldFor(e.until)})
}

// heldFor is message.For of an entry held until until (1 ms once that
// has passed: it is still held).
func (r *Registry) heldFor(until time.Time) int64 {
	d := until.Sub(r.now())
	if d <= 0 {
		d = time.Millisecond
	}
	return int64(d)
}

// denounce tells the other processes that e is no longer held (r.mu held).
func (r *Registry) denounce(e *Entry) {
	r.publish(message{Kind: "leave", ID: e.id})
}

// preemptRemote asks the peers holding batch entries on keys to preempt
// them for e, an interactive entry held until until at the latest, and
// returns the entry Wait waits on for their answers (r.mu held).
func (r *Registry) preemptRemote(e *Entry, keys []string, peers map[string]bool, until time.Time) *Entry {
	r.endPreemption(e.id) // preempting again (held after Preempt): the earlier wait is over
	r.preemptSeq++
	p := &preemption{seq: r.preemptSeq, peers: peers, victim: &Entry{r: r, done: make(chan struct{})}}
	r.preemptions[e.id] = p
	pending := e.settled != nil && !e.isSettled
	r.publish(message{Kind: "preempt", ID: e.id, Seq: p.seq, Keys: keys, For: r.heldFor(until), Pending: pending})
	id := e.id
	time.AfterFunc(r.ackTimeout, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.preemptions[id] == p {
			// Peers that did not answer: forget their batch entries on
			// keys (had they heard, those would have left), so that the
			// next interactive request does not wait for them again.
			for _, k := range keys {
				for rid, re := range r.byKey[k] {
					if re.batch && p.peers[rid.from] {
						r.dropRemote(rid)
					}
				}
			}
			r.endPreemption(id)
		}
	})
	return p.victim
}

// endPreemption ends the preemption of entry id: its waiter goes on (r.mu
// held).
func (r *Registry) endPreemption(id uint64) {
	if p := r.preemptions[id]; p != nil {
		delete(r.preemptions, id)
		close(p.victim.done)
	}
}

// Rejected is how many messages from the Link Receive refused: malformed
// (another process publishes on the channel), or holds beyond the number
// of other processes' entries kept.
func (r *Registry) Rejected() int64 { return r.rejected.Load() }

// Receive takes a message from the Link: one of this process's own is
// ignored; a malformed one is counted (Rejected) and ignored.
func (r *Registry) Receive(b []byte) {
	m, err := decodeMessage(b)
	if err != nil {
		r.rejected.Add(1)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if m.From == r.self {
		return
	}
	now := r.now()
	id := remoteID{m.From, m.ID}
	switch m.Kind {
	case "hold":
		r.settleRemote(id)
		r.dropRemote(id)
		if len(r.remote) >= r.maxRemote {
			if now.Sub(r.lastPrune) >= pruneEvery {
				r.pruneRemote(now)
			}
			if len(r.remote) >= r.maxRemote {
				r.rejected.Add(1)
				break
			}
		}
		r.putRemote(id, &remoteEntry{batch: m.Batch, keys: m.Keys, until: now.Add(time.Duration(m.For))})
	case "leave":
		r.settleRemote(id)
		r.dropRemote(id)
	case "preempt":
		until := now.Add(time.Duration(m.For))
		victims := r.batchOn(m.Keys, nil)
		if len(victims) > 0 {
			var by *Entry // the preempting entry, while it is still to be decided
			if m.Pending {
				if by = r.awaiting[id]; by == nil {
					by = &Entry{r: r, until: until, settled: make(chan struct{})}
					r.awaiting[id] = by
				}
			}
			r.preemptAll(victims, by, until)
		}
		answer := message{Kind: "gaveback", ID: m.ID, Seq: m.Seq, To: m.From}
		if len(victims) == 0 {
			r.publish(answer)
			break
		}
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), r.ackTimeout)
			defer cancel()
			_ = Wait(ctx, victims)
			r.mu.Lock()
			defer r.mu.Unlock()
			r.publish(answer)
		}()
	case "gaveback":
		if p := r.preemptions[m.ID]; m.To == r.self && p != nil && p.seq == m.Seq {
			delete(p.peers, m.From)
			if len(p.peers) == 0 {
				r.endPreemption(m.ID)
			}
		}
	}
	if r.received++; r.received%64 == 0 {
		r.pruneRemote(now)
	}
}

// settleRemote says that another process's pending entry was decided
// (r.mu held).
func (r *Registry) settleRemote(id remoteID) {
	if e := r.awaiting[id]; e != nil {
		delete(r.awaiting, id)
		e.settle()
	}
}

// putRemote keeps another process's entry (r.mu held).
func (r *Registry) putRemote(id remoteID, e *remoteEntry) {
	r.remote[id] = e
	if e.batch {
		r.remoteBatches.Add(1)
	}
	for _, k := range e.keys {
		if r.byKey[k] == nil {
			r.byKey[k] = map[remoteID]*remoteEntry{}
		}
		r.byKey[k][id] = e
	}
}

// dropRemote forgets another process's entry (r.mu held).
func (r *Registry) dropRemote(id remoteID) {
	e := r.remote[id]
	if e == nil {
		return
	}
	delete(r.remote, id)
	if e.batch {
		r.remoteBatches.Add(-1)
	}
	for _, k := range e.keys {
		delete(r.byKey[k], id)
		if len(r.byKey[k]) == 0 {
			delete(r.byKey, k)
		}
	}
}

// pruneRemote forgets the entries of other processes whose time is up: a
// leave lost on the way (r.mu held).
func (r *Registry) pruneRemote(now time.Time) {
	r.lastPrune = now
	for id, e := range r.remote {
		if !e.until.After(now) {
			r.dropRemote(id)
		}
	}
	for id, e := range r.awaiting {
		if !e.until.After(now) {
			r.settleRemote(id)
		}
	}
}

// remoteBusy is when the last interactive entry of another process on any
// of keys goes, and whether there is one (r.mu held).
func (r *Registry) remoteBusy(keys []string) (last time.Time, found bool) {
	if len(r.remote) == 0 {
		return last, false
	}
	now := r.now()
	for _, k := range keys {
		for _, e := range r.byKey[k] {
			if !e.batch && e.until.After(now) {
				found = true
				if e.until.After(last) {
					last = e.until
				}
			}
		}
	}
	return last, found
}

// remoteBatchOn is the processes holding batch entries on any of keys,
// and which of keys those entries wait on (r.mu held).
func (r *Registry) remoteBatchOn(keys []string) (peers map[string]bool, on []string) {
	if r.remoteBatches.Load() == 0 {
		return nil, nil
	}
	now := r.now()
	for _, k := range keys {
		for id, e := range r.byKey[k] {
			if !e.batch || !e.until.After(now) {
				continue
			}
			if peers == nil {
				peers = map[string]bool{}
			}
			peers[id.from] = true
			if !slices.Contains(on, k) {
				on = append(on, k)
			}
		}
	}
	if peers == nil && now.Sub(r.lastPrune) >= pruneEvery {
		r.pruneRemote(now) // BatchHeld said yes: if only expired entries did, stop saying it
	}
	return peers, on
}
