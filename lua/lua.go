// Package lua holds Cascade's Redis scripts, embedded in the binary. It has
// nothing else: the Redis store (package store) decides what to send, and
// package rate holds the arithmetic the scripts mirror.
//
// # Why scripts
//
// A decision must read every bucket on a request's path, check them all and
// charge them all or none, atomically with respect to every other Caddy
// instance. A Lua script runs atomically inside Redis, so one EVALSHA decides
// a request: one round trip whatever the number of tiers and limits (and,
// under load, one EVALSHA decides a whole batch of requests; see Batches).
//
// # Mirroring package rate
//
// rate.lua holds the arithmetic of rate/rate.go and rate/log.go (GCRA in
// level form, the exact sliding window's log, the two-counter sliding
// window, the calendar quota), function for function and operation for
// operation. Lua numbers are IEEE-754 doubles like Go's
// float64, so the same operations in the same order give bit-identical
// results: the memory store and the Redis store reach the same decisions,
// remaining counts and retry times. decide.lua writes GCRA out in its loop
// rather than calling rate.lua's apply, with the same operations in the same
// order. TestScriptsMirrorRate checks all of it on random states against
// rate.Limit.Apply and rate.Limit.Adjust, and TestDecidePathMirrorsRate on
// random paths of mixed algorithms.
//
// # Time
//
// A script reads the time from Redis TIME (µs = sec·1e6 + usec), so the
// clocks of Caddy instances never matter — unless the clock argument (see
// below) is non-zero: then it is the time, in µs since the epoch. The Go
// store sends a non-zero value only when it was given a test clock; that is
// how the conformance suite drives time.
//
// # Calling convention
//
// Both scripts take bucket keys in KEYS (all in one Cluster slot; key i
// counts from 1, as in Lua), each exact sliding window's key followed by
// the key of its log (see Storage), and the numbers of a decision in ONE
// packed string, little-endian:
//
//	float64        the test clock in µs, or 0 for Redis TIME
//	then for each bucket, in order:
//	byte           the algorithm: 0 gcra, 1 sliding_approx, 2 calendar,
//	               3 sliding (exact), 4 concurrent, 5 idempotent (an
//	               idempotency record; any other code is gcra, as in
//	               rate.Limit.Apply)
//	float64 × 4    count     Limit.Count
//	               period    Limit.Period in µs (0 for calendar; for
//	                         concurrent, how long a slot lasts unrenewed)
//	               capacity  Limit.Capacity()
//	               cost      Bucket.Cost (Adjust: the signed delta)
//	float64 × 4    for calendar only: the bounds, in µs, of the previous,
//	               current and next calendar windows around the Go clock
//	               (Limit.Window); the script uses the one holding its own
//	               time, so clock skew at a boundary never matters
//	float64        for an exact sliding window only: its tick (Limit.Tick)
//	float64        for concurrent only: the slot's holder (Bucket.Holder)
//
// A concurrency limit's key is not a string but a sorted set: one member
// per slot taken (its holder, packed as a float64), scored with the time
// (µs, on the script's clock) by which its holder must renew it
// (RenewSlots); a slot past its time is dropped by the next decision, so an
// instance that died gives its slots back. Adjust gives a slot back (a
// negative cost) by removing its member: twice is once.
//
// The script reads it with struct.unpack at a moving offset. One packed
// argument, rather than decimal strings (tonumber) or one argument per
// number, costs Redis the least time; integers below 2^53 are exact.
//
// Adjust takes one such string, ARGV[1], for the buckets in KEYS, in order,
// with the signed correction in the cost's place and, in the capacity's,
// the start of the window in which the corrected cost was charged
// (rate.Limit.ChargeWindow, 0 when unknown: a refund goes back to that
// window only). It replies with the number of buckets adjusted.
//
// Decide takes one or more decisions: ARGV[2], ARGV[3], ... one string
// each, applied in order, each all or nothing on its own, all of them one
// atomic step. KEYS holds each distinct key once (with its log key after
// it), and ARGV[1] maps every bucket of every decision, in order, to its
// key: one little-endian uint16 index into KEYS (from 1) per bucket, or the
// empty string when the buckets of the call simply take the keys in order
// (a lone decision, or a batch that shares no key). Decide writes a key only if
// a decision that admits charges it, and each key at most once per call. It
// replies with ONE string: for each decision in order, six little-endian
// float64s per bucket — allowed (0/1), impossible (0/1), remaining,
// before, retry (µs), reset (µs): the fields of rate.Result, each a whole
// number — then the time the decision was made at (µs; store.Decision.At), which
// a refund of its charges names. A binary string costs Redis far less to
// build and send than a table of 6·n integers.
//
// # Batches
//
// The Redis store sends the decisions that queue up while others are on
// the wire as one Decide call. Redis then pays the fixed cost of a script
// call (dispatch, TIME, the MGET, creating the script's tables) once for
// the batch, and reads and writes a key that several decisions share — an
// organisation's or a team's bucket — once instead of once per decision.
// The result is the same as the decisions sent one by one in that order at
// one instant: TestDecideBatchIsSequential checks it.
//
// # Redis time
//
// The scripts run on Redis's single thread, so their cost is every
// instance's latency. Besides the packed argument and reply: decide.lua
// inlines GCRA (the common algorithm) and the write, and creates the
// closures of rate.lua (sliding windows, calendar) only when a path holds such
// a bucket, as every closure a script creates costs time on each call.
// An exact sliding window's decision reads only the log entries that have
// left the window and writes one (LLEN, LINDEX or LRANGE, LPOP, RPUSH on
// its list): its cost does not grow with the log (BenchmarkSlidingWindow:
// 8–9 µs of Redis time at N = 10, 100 or 1,000, beside GCRA's 4), where
// making a 10 KB log into a Lua string would cost Redis 9 µs each time.
//
// # Storage
//
// A bucket's state is one 32-byte string of little-endian float64s: A, B, T
// (rate.State, exact) and E, the time until which the key's expiry is known
// to keep it. An exact sliding window's adds H and M, its rate.Log's
// oldest time and number of entries, and keeps the entries in a list at its
// log key (the bucket's key and "~log", in its slot): 10 bytes each, the
// gap to the next newer entry and the cost, at most Count (and the debts)
// for a fine window and MaxExact + 1 for a coarse one. Every key has an
// expiry of at least rate.Limit.TTL: a write sets one an eighth (at least
// a second) longer than needed (SET … PX), and later writes whose TTL fits
// before E keep it (SET … KEEPTTL), which saves Redis a good part of a
// write's cost; a log key expires with its bucket's key, a millisecond or
// two after it. A state with no TTL (a full bucket) is deleted, its log
// with it.
package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// rateSource is the shared arithmetic, prepended to each script.
//
//go:embed rate.lua
var rateSource string

//go:embed decide.lua
var decideSource string

//go:embed adjust.lua
var adjustSource string

// Decide is the all-or-nothing decision script (see the package doc for its
// keys, arguments and reply). Run it with Script.Run, which sends EVALSHA and
// falls back on EVAL when Redis answers NOSCRIPT.
var Decide = redis.NewScript(rateSource + decideSource)

// Adjust is the correction script: each key's delta is a refund (negative)
// or a debt (positive), applied atomically as rate.Limit.Adjust does.
var Adjust = redis.NewScript(rateSource + adjustSource)

//go:embed renew.lua
var renewSource string

// Renew gives the concurrency slots an instance holds a new expiry (see
// renew.lua): the slots of its requests in flight outlive their TTL, and
// those of an instance that is gone do not.
var Renew = redis.NewScript(rateSource + renewSource)

//go:embed lease.lua
var leaseSource string

// Lease gives back what leases left unspent and decides a request while
// leasing further capacity on its path, atomically (see lease.lua and
// store.Leaser).
var Lease = redis.NewScript(rateSource + leaseSource)

//go:embed factor.lua
var factorSource string

// Factor publishes one instance's adaptive factor and returns the minimum
// fresh factor of all instances (see factor.lua for its arguments), so
// that Caddy instances sharing a Redis converge on one factor.
var Factor = redis.NewScript(factorSource)

//go:embed presence.lua
var presenceSource string

// Presence stamps one instance's heartbeat and counts the instances heard
// from recently (see presence.lua), for on_store_error local's share.
var Presence = redis.NewScript(presenceSource)

//go:embed control.lua
var controlSource string

// Control changes one field of the runtime state (package control) and
// increments its version, atomically: see control.lua.
var Control = redis.NewScript(controlSource)
