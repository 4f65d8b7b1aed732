package store

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"time"
)

// Anyone who may PUBLISH on the Redis a store uses can talk to the Buses
// of every instance sharing it. With a bus key (SetBusKey) each message
// carries an HMAC-SHA256 under it, and a Bus delivers only the messages
// that verify: a forged one, an unsigned one, or a recorded one played
// again, is dropped and counted (BusStats). Whatever the key, a message
// longer than MaxBusMessage is dropped and counted, and what a Bus
// delivers is validated by its receiver (package lease, package waiting).
//
// A signed message is
//
//	busMagic | sender (16 bytes) | seq (8, big-endian) | sent (8, big-endian
//	Unix ms) | HMAC (32) | payload
//
// where the HMAC covers the channel's name, the sender, seq, the time it
// was sent and the payload: a message cannot be moved to another channel,
// nor its payload changed. sender names the publishing process (one per
// store) and seq grows with each of its messages; a Bus remembers, per
// sender, the highest seq heard and which of the 64 before it were heard,
// and drops a seq heard before or older than that window. A message sent
// more than busMaxAge away from the receiver's clock is dropped too, so
// that a recording cannot be played to a process that has not heard its
// sender yet (one just started) once it is that old; within busMaxAge,
// such a process may take a recording once, and the receivers bound what
// any one message can do (a reset revokes leases, which only
// under-admits; a held entry is believed for an hour at most).

// MaxBusMessage bounds the payload of one message on a Bus: every message
// Cascade sends is a few hundred bytes (a path's keys), a reset's list of
// keys is split to fit; a longer one is dropped, by its sender and by its
// receivers.
const MaxBusMessage = 64 << 10

// busMagic starts a signed message: no JSON message starts with NUL.
const busMagic = "\x00cb2"

const (
	busSenderLen = 16
	busSeqLen    = 8
	busSentLen   = 8
	busMACLen    = sha256.Size
	busHeadLen   = busSenderLen + busSeqLen + busSentLen // what follows busMagic, before the HMAC
	busHeaderLen = len(busMagic) + busHeadLen + busMACLen
	// busMaxAge is how far from the receiver's clock a message's time of
	// sending may be: the instances' clocks agree to within a second or so
	// (NTP); delivery takes milliseconds.
	busMaxAge = 30 * time.Second
	// busSenders bounds the senders a Bus remembers the seq of: only
	// authenticated messages add one, so they are the fleet's processes.
	busSenders = 4096
	// busWindow is how far out of order (in seq) a sender's messages may
	// arrive: PublishOnce's concurrent callers race to the wire.
	busWindow = 64
)

// BusStats counts the messages the Buses of a store dropped.
type BusStats struct {
	// Dropped counts messages not published: the queue was full, Redis
	// did not take them, or they were longer than MaxBusMessage.
	Dropped int64
	// Oversized counts messages heard longer than MaxBusMessage.
	Oversized int64
	// Unauthenticated counts messages heard that did not verify under the
	// bus key: unsigned, forged, of another key — or signed when this
	// instance has no key.
	Unauthenticated int64
	// Replayed counts signed messages heard a second time, or too late
	// (beyond the window of their sender's recent messages).
	Replayed int64
}

// busCounters are BusStats, counted.
type busCounters struct {
	dropped, oversized, unauthenticated, replayed atomic.Int64
}

func (c *busCounters) stats() BusStats {
	return BusStats{Dropped: c.dropped.Load(), Oversized: c.oversized.Load(),
		Unauthenticated: c.unauthenticated.Load(), Replayed: c.replayed.Load()}
}

// busState is what the Buses of one Redis store share (and PublishOnce).
type busState struct {
	key    []byte // nil: messages are neither signed nor checked
	sender [busSenderLen]byte
	seq    atomic.Uint64
	counts busCounters
	now    func() time.Time // time.Now but in tests
}

// newBusState is a store's busState: unauthenticated, under a sender id
// of its own.
func newBusState() *busState {
	s := &busState{now: time.Now}
	_, _ = rand.Read(s.sender[:])
	return s
}

// bus returns r's busState.
func (r *Redis) bus() *busState { return r.busState }

// SetBusKey makes r's Buses (and PublishOnce) sign every message with key
// and deliver only the messages that verify under it; nil sends and
// delivers them unsigned. Derive key with BusKey. Set it before any Bus
// is opened.
func (r *Redis) SetBusKey(key []byte) {
	r.bus().key = key
}

// BusKey derives the key of SetBusKey from a configured secret, or (when
// derived is true) from the store's credentials: the processes that share
// them agree on the key without another setting.
func BusKey(secret string, derived bool) []byte {
	label := "cascade bus v1: secret"
	if derived {
		label = "cascade bus v1: credentials"
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(label))
	return m.Sum(nil)
}

// BusStats is what the Buses of r (and PublishOnce) dropped, in all.
func (r *Redis) BusStats() BusStats { return r.bus().counts.stats() }

// seal is msg as published on channel: signed, when there is a key.
func (s *busState) seal(channel string, msg []byte) []byte {
	if s.key == nil {
		return msg
	}
	out := make([]byte, busHeaderLen, busHeaderLen+len(msg))
	copy(out, busMagic)
	copy(out[len(busMagic):], s.sender[:])
	binary.BigEndian.PutUint64(out[len(busMagic)+busSenderLen:], s.seq.Add(1))
	binary.BigEndian.PutUint64(out[len(busMagic)+busSenderLen+busSeqLen:], uint64(s.now().UnixMilli()))
	mac := s.mac(channel, out[len(busMagic):len(busMagic)+busHeadLen], msg)
	copy(out[busHeaderLen-busMACLen:], mac)
	return append(out, msg...)
}

// mac is the HMAC of a message: its channel, sender and seq (head), and
// payload.
func (s *busState) mac(channel string, head, payload []byte) []byte {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(busMagic))
	m.Write([]byte(channel))
	m.Write([]byte{0})
	m.Write(head)
	m.Write(payload)
	return m.Sum(nil)
}

// Why a message heard is not delivered.
var (
	errBusOversized       = errors.New("longer than MaxBusMessage")
	errBusUnauthenticated = errors.New("not authenticated by the bus key")
	errBusReplayed        = errors.New("heard before (replayed)")
)

// opener checks the messages one Bus hears: it remembers its senders'
// recent seqs. It is used by one goroutine at a time.
type opener struct {
	state   *busState
	channel string
	senders map[[busSenderLen]byte]*seqWindow
}

func newOpener(s *busState, channel string) *opener {
	return &opener{state: s, channel: channel, senders: map[[busSenderLen]byte]*seqWindow{}}
}

// open returns the payload of msg, heard on the channel, or why it is to
// be dropped.
func (o *opener) open(msg []byte) ([]byte, error) {
	signed := len(msg) >= len(busMagic) && string(msg[:len(busMagic)]) == busMagic
	if o.state.key == nil {
		if signed {
			return nil, errBusUnauthenticated // signed under a key this process does not have
		}
		if len(msg) > MaxBusMessage {
			return nil, errBusOversized
		}
		return msg, nil
	}
	if len(msg) > busHeaderLen+MaxBusMessage {
		return nil, errBusOversized
	}
	if !signed || len(msg) < busHeaderLen {
		return nil, errBusUnauthenticated
	}
	head := msg[len(busMagic) : len(busMagic)+busHeadLen]
	payload := msg[busHeaderLen:]
	if !hmac.Equal(msg[busHeaderLen-busMACLen:busHeaderLen], o.state.mac(o.channel, head, payload)) {
		return nil, errBusUnauthenticated
	}
	sent := time.UnixMilli(int64(binary.BigEndian.Uint64(head[busSenderLen+busSeqLen:])))
	if age := o.state.now().Sub(sent); age > busMaxAge || age < -busMaxAge {
		return nil, errBusReplayed // a recording, or a clock far off
	}
	sender := [busSenderLen]byte(head[:busSenderLen])
	seq := binary.BigEndian.Uint64(head[busSenderLen:])
	w := o.senders[sender]
	if w == nil {
		if len(o.senders) >= busSenders {
			for k := range o.senders { // forget one: it may replay once more
				delete(o.senders, k)
				break
			}
		}
		w = &seqWindow{}
		o.senders[sender] = w
	}
	if !w.accept(seq) {
		return nil, errBusReplayed
	}
	return payload, nil
}

// seqWindow is a sender's seqs heard: the highest, and which of the
// busWindow before it (bit i: highest−i).
type seqWindow struct {
	highest uint64
	seen    uint64
}

// accept records seq, and reports whether it was not heard before (nor is
// older than the window).
func (w *seqWindow) accept(seq uint64) bool {
	switch {
	case seq == 0:
		return false
	case seq > w.highest:
		if shift := seq - w.highest; shift >= busWindow {
			w.seen = 0
		} else {
			w.seen <<= shift
		}
		w.seen |= 1
		w.highest = seq
		return true
	}
	d := w.highest - seq
	if d >= busWindow || w.seen&(1<<d) != 0 {
		return false
	}
	w.seen |= 1 << d
	return true
}

// count counts a message heard and dropped for err, on c.
func (c *busCounters) count(err error) {
	switch err {
	case errBusOversized:
		c.oversized.Add(1)
	case errBusReplayed:
		c.replayed.Add(1)
	default:
		c.unauthenticated.Add(1)
	}
}
