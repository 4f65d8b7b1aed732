package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// batcher sends decisions to Redis. A decision that arrives while Redis is
// idle goes at once, as its own lua.Decide call; the decisions that arrive
// while earlier ones are on the wire wait for the next free worker and go
// together, as ONE lua.Decide call over all of them (one per hash slot on
// a Cluster). Batching never waits for company: it only takes what is
// already queued, so it costs a lone request nothing.
//
// What a batch saves is most of the cost of a decision under load. Redis
// pays the fixed price of a script call (the dispatch, TIME, the MGET, the
// script's tables) once per batch instead of once per decision; a key that
// several decisions share, as every request of an organisation shares its
// organisation's bucket, is read and written once per batch; and the
// system calls of a round trip are shared on both sides. Each decision is
// still all or nothing on its own, and the batch is one atomic step: the
// outcome is that of the decisions sent one by one, in queue order, at one
// instant.
type batcher struct {
	client  redis.UniversalClient // the server's, or one Cluster master's
	script  *redis.Script
	timeout time.Duration
	cluster bool // a Cluster master's: group batches by hash slot
	// slots is the Cluster's slot map, reloaded when the master fails or
	// answers that a slot moved (see refresh); nil elsewhere.
	slots   *slotMap
	breaker *breaker // this master's (nil: none)
	queue   *fairQueue
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once
}

// batchers are the batchers of a store: one for a single server (or a
// Sentinel's master), and one per master of a Cluster, so that a slow or
// stalled master holds up only the decisions whose slots it serves: its own
// workers wait for it, never another master's; and its own circuit
// breaker fails them at once when it is down, never another master's.
type batchers struct {
	single    *batcher             // nil on a Cluster
	cluster   *redis.ClusterClient // nil unless a Cluster
	slots     *slotMap             // the Cluster's; nil unless a Cluster
	script    *redis.Script
	timeout   time.Duration
	perTenant int // RedisOptions.TenantInFlight, per batcher
	// newNode is told of each Cluster master first met, under mu (it must
	// not block), and returns its breaker (nil: none).
	newNode func(addr string, client *redis.Client) *breaker

	mu       sync.Mutex
	byNode   map[string]*batcher // by master address
	breakers map[string]*breaker // by master address: a node keeps its breaker when its batcher is replaced
	closed   bool
}

// newBatchers makes the batchers of client; single is the breaker of a
// single server or Sentinel master (nil: none); newNode, that of each
// master of a Cluster.
func newBatchers(client redis.UniversalClient, script *redis.Script, timeout time.Duration, perTenant int,
	single *breaker, newNode func(addr string, client *redis.Client) *breaker) *batchers {
	bs := &batchers{script: script, timeout: timeout, perTenant: perTenant, newNode: newNode,
		byNode: map[string]*batcher{}, breakers: map[string]*breaker{}}
	if cc, ok := client.(*redis.ClusterClient); ok {
		bs.cluster = cc
		bs.slots = &slotMap{cluster: cc, timeout: min(timeout, slotReloadTimeout)}
	} else {
		bs.single = newBatcher(client, script, timeout, false, perTenant)
		bs.single.breaker = single
	}
	return bs
}

// allBreakers are the store's breakers: the single one, or each Cluster
// master's met so far, by address.
func (bs *batchers) allBreakers() []*breaker {
	if bs.single != nil {
		if bs.single.breaker == nil {
			return nil
		}
		return []*breaker{bs.single.breaker}
	}
	bs.mu.Lock()
	defer bs.mu.Unlock()
	out := make([]*breaker, 0, len(bs.breakers))
	for _, b := range bs.breakers {
		if b != nil {
			out = append(out, b)
		}
	}
	slices.SortFunc(out, func(a, b *breaker) int { return strings.Compare(a.node, b.node) })
	return out
}

// reload has a Cluster's slot map reloaded (see slotMap): a master that
// fails may have been replaced.
func (bs *batchers) reload() { bs.slots.reload() }

// slotMap reloads a Cluster client's slot map on demand, in the
// background: one reload at a time, at most one every 100 ms however often
// it is asked, each bounded by slotReloadTimeout. (go-redis's own lazy
// reload has no deadline: when it asks a hung node first, it waits out the
// read timeout, seconds, before it asks another.)
type slotMap struct {
	cluster *redis.ClusterClient
	timeout time.Duration
	running atomic.Bool
	last    atomic.Int64 // when the last reload started (Unix ns)
}

// slotReloadEvery is the least time between two reloads of a slot map.
const slotReloadEvery = 100 * time.Millisecond

// slotReloadTimeout bounds one reload of a slot map: a healthy node
// answers CLUSTER SLOTS in a millisecond, and a reload that asked a hung
// one first gives way to the next.
const slotReloadTimeout = 250 * time.Millisecond

func (m *slotMap) reload() {
	if m == nil {
		return
	}
	now := time.Now().UnixNano()
	if now-m.last.Load() < int64(slotReloadEvery) || !m.running.CompareAndSwap(false, true) {
		return
	}
	m.last.Store(now)
	go func() {
		defer m.running.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
		defer cancel()
		// ForEachMaster reloads the map first, within ctx; there is
		// nothing to do on each master.
		_ = m.cluster.ForEachMaster(ctx, func(context.Context, *redis.Client) error { return nil })
	}()
}

// forKey returns the batcher of the master serving key's slot, from the
// client's slot map (which it loads, by deadline, if it has none).
func (bs *batchers) forKey(ctx context.Context, deadline time.Time, key string) (*batcher, error) {
	if bs.single != nil {
		return bs.single, nil
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	node, err := bs.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	addr := node.Options().Addr
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.closed {
		return nil, redis.ErrClosed
	}
	b := bs.byNode[addr]
	if b != nil && b.client != node {
		// The cluster client replaced the node's client (the node left
		// the slot map and came back): the old one is closed.
		go b.close()
		b = nil
	}
	if b == nil {
		// A node's calls of several slots are grouped by slot: one
		// script call per slot, pipelined to the node.
		b = newBatcher(node, bs.script, bs.timeout, true, bs.perTenant)
		b.slots = bs.slots
		br, ok := bs.breakers[addr]
		if !ok && bs.newNode != nil {
			br = bs.newNode(addr, node)
			bs.breakers[addr] = br
		}
		b.breaker = br
		bs.byNode[addr] = b
	}
	return b, nil
}

// close stops every batcher and breaker; calls still queued fail.
func (bs *batchers) close() {
	bs.mu.Lock()
	bs.closed = true // no batcher or breaker is made from now on
	all := make([]*batcher, 0, len(bs.byNode))
	for _, b := range bs.byNode {
		all = append(all, b)
	}
	bs.mu.Unlock()
	for _, br := range bs.allBreakers() {
		br.close()
	}
	if bs.single != nil {
		bs.single.close()
		return
	}
	for _, b := range all {
		b.close()
	}
}

// call is one decision waiting for its reply.
type call struct {
	ctx      context.Context
	deadline time.Time
	keys     []string // a key per bucket
	logs     []string // an exact sliding window's log key per bucket ("" for others), or nil (see Redis.encode)
	spec     []byte   // the decision's packed numbers (see package lua)
	name     string   // the tenant's, or "" for that of the last key
	tenant   *tenantCalls
	takenAt  time.Time // when a worker took it (fairQueue.mu); zero while queued
	reply    string
	err      error
	done     chan struct{}
}

const (
	batchWorkers    = 2    // batches in flight at once, each on its own connection
	batchMax        = 64   // decisions in one batch at most
	batchMaxBuckets = 1024 // buckets in one batch at most: a bounded script run, and key indexes fit a uint16
)

func newBatcher(client redis.UniversalClient, script *redis.Script, timeout time.Duration, cluster bool, perTenant int) *batcher {
	b := &batcher{
		client:  client,
		script:  script,
		timeout: timeout,
		cluster: cluster,
		queue:   newFairQueue(perTenant),
		stop:    make(chan struct{}),
	}
	for i := 0; i < batchWorkers; i++ {
		b.done.Add(1)
		go b.work()
	}
	return b
}

// do decides one decision, keys and its packed numbers, and waits for its
// reply, or until deadline. A request whose client has gone (ctx) still
// waits for its reply, at most until deadline: its decision is on its way
// to Redis either way.
func (b *batcher) do(ctx context.Context, deadline time.Time, tenant string, keys, logs []string, spec []byte) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	c := &call{ctx: ctx, deadline: deadline, name: tenant, keys: keys, logs: logs, spec: spec, done: make(chan struct{})}
	if err := b.queue.push(c); err != nil {
		return "", err
	}
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	select {
	case <-c.done:
		return c.reply, c.err
	case <-timeout.C:
		queued, takenAt := b.queue.abandon(c)
		if queued || b.starved(c, takenAt) {
			return "", ErrQueueTimeout
		}
		// The script may still run: as with any timed-out call, the
		// request is then charged without being served.
		return "", context.DeadlineExceeded
	}
}

// close stops the workers; calls still queued, and calls pushed from now
// on, fail at once with redis.ErrClosed.
func (b *batcher) close() {
	b.once.Do(func() { close(b.stop) })
	b.done.Wait()
	b.queue.close()
}

// work takes batches from the queue (see fairQueue: round robin across
// tenants) and sends them, until the batcher stops.
func (b *batcher) work() {
	defer b.done.Done()
	batch := make([]*call, 0, batchMax)
	m := &merger{index: map[string]uint16{}}
	for {
		select {
		case <-b.stop:
			return
		default:
		}
		batch = b.queue.take(batch[:0], batchMax, batchMaxBuckets)
		if len(batch) == 0 {
			select {
			case <-b.stop:
				return
			case <-b.queue.wake:
			}
			continue
		}
		b.send(batch, m)
		clear(batch) // the calls are answered: not kept alive by the next batch's slice
	}
}

// send decides one batch and hands each call its reply. The batch waits
// for Redis until the LATEST deadline of its calls (at most one timeout
// from now): each call still gives up at its own deadline (do's timer),
// and a decision that joined a batch late is not failed early because an
// older one was about to expire.
func (b *batcher) send(batch []*call, m *merger) {
	live := make([]*call, 0, len(batch)) // not batch[:0]: batch is still the queue's to account for
	now := time.Now()
	var deadline time.Time
	for _, c := range batch {
		err := c.ctx.Err()
		if err == nil && !now.Before(c.deadline) {
			err = ErrQueueTimeout // never sent
		}
		if err != nil {
			c.err = err
			b.answer([]*call{c})
			continue
		}
		if d, ok := c.ctx.Deadline(); ok && d.Before(c.deadline) {
			c.deadline = d
		}
		if c.deadline.After(deadline) {
			deadline = c.deadline
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	if limit := now.Add(b.timeout); deadline.After(limit) {
		deadline = limit
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	groups := [][]*call{live}
	if b.cluster && len(live) > 1 {
		groups = bySlot(live)
	}
	// One script call for the batch, or one per slot of a Cluster master
	// (pipelined).
	keys := make([][]string, len(groups))
	args := make([][]any, len(groups))
	for i, g := range groups {
		keys[i], args[i] = m.merge(g)
	}
	replies, errs := runCalls(ctx, b.client, b.script, keys, args)
	for i, g := range groups {
		b.refresh(errs[i])
		b.deliver(g, replies[i], errs[i])
	}
}

// bySlot groups calls by the Cluster hash slot of their keys (each call's
// keys share one slot), keeping queue order within each group.
func bySlot(calls []*call) [][]*call {
	idx := groupBySlot(len(calls), func(i int) int { return RedisKeySlot(calls[i].keys[0]) })
	groups := make([][]*call, len(idx))
	for g, members := range idx {
		for _, i := range members {
			groups[g] = append(groups[g], calls[i])
		}
	}
	return groups
}

// refresh has a Cluster's slot map reloaded (in the background, at most
// one every 100 ms) when a master's answer says the map may be
// out of date: the store does not follow redirects (a script is never
// sent twice), so the map must catch up for the next decisions.
func (b *batcher) refresh(err error) {
	if staleSlots(err) {
		b.slots.reload()
	}
}

// staleSlots tells whether a Cluster master's err may mean that its slots
// are now served elsewhere: a slot moved (MOVED, ASK), the cluster is
// reconfiguring (CLUSTERDOWN, TRYAGAIN), the node has become a replica
// (READONLY), or it cannot be reached (refused, reset, timed out) — a dead
// master answers nothing, never MOVED, and its replica takes over meanwhile.
// This instance's own overload says nothing of Redis.
func staleSlots(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, redis.ErrClosed) || overloaded(err) {
		return false
	}
	for _, prefix := range []string{"MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN", "READONLY"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	var redisErr redis.Error
	if errors.As(err, &redisErr) {
		return false // any other answer: the node is there, and serves the slot
	}
	return true // refused, reset, EOF, timed out
}

// deliver cuts a batch's reply into each call's part (replySize: six
// float64s per bucket, in order, then the decision's time) and wakes the
// calls.
func (b *batcher) deliver(calls []*call, reply string, err error) {
	if err == nil {
		n := 0
		for _, c := range calls {
			n += replySize(len(c.keys))
		}
		if len(reply) != n {
			err = fmt.Errorf("decide script returned %d bytes for %d bytes of results", len(reply), n)
		}
	}
	for _, c := range calls {
		if err != nil {
			c.err = err
			if (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) && b.starved(c, c.takenAt) {
				c.err = ErrQueueTimeout
			}
		} else {
			n := replySize(len(c.keys))
			c.reply, reply = reply[:n], reply[n:]
		}
	}
	b.answer(calls)
}

// starved tells whether a call taken at takenAt had too little of its time
// left for Redis (less than half the timeout) to blame Redis for its
// timeout: its time went waiting in this instance's queue.
func (b *batcher) starved(c *call, takenAt time.Time) bool {
	return !takenAt.IsZero() && c.deadline.Sub(takenAt) < b.timeout/2
}

// answer wakes calls whose reply or err is set, once the queue no longer
// counts them in flight: a caller that decides again at once is not
// refused for its own answered call.
func (b *batcher) answer(calls []*call) {
	if b.queue != nil {
		b.queue.finished(calls)
	}
	for _, c := range calls {
		close(c.done)
	}
}

// merger lays out a batch as lua.Decide takes it: each distinct key once in
// KEYS (an exact sliding window's followed by its log key), and ARGV the
// key index of every bucket, then every decision's packed numbers. Its map
// is kept from batch to batch.
type merger struct {
	index map[string]uint16
}

func (m *merger) merge(calls []*call) (keys []string, args []any) {
	if len(calls) == 1 {
		return interleave(calls[0].keys, calls[0].logs), []any{"", calls[0].spec}
	}
	clear(m.index)
	buckets := 0
	for _, c := range calls {
		buckets += len(c.keys)
	}
	keys = make([]string, 0, buckets)
	idx := make([]byte, 0, 2*buckets)
	args = make([]any, 1, 1+len(calls))
	shared := false
	for _, c := range calls {
		for j, k := range c.keys {
			i, ok := m.index[k]
			if !ok {
				keys = append(keys, k)
				i = uint16(len(keys))
				m.index[k] = i
				if c.logs != nil && c.logs[j] != "" {
					keys = append(keys, c.logs[j]) // KEYS[i+1]
				}
			}
			shared = shared || ok
			idx = binary.LittleEndian.AppendUint16(idx, i)
		}
		args = append(args, c.spec)
	}
	if !shared {
		args[0] = "" // no key shared: the buckets take the keys in order
	} else {
		args[0] = idx
	}
	return keys, args
}

// runCalls sends calls of script to client, call i with keys[i] and
// args[i], and returns each call's reply and error, in order. One call is
// Run (EVALSHA, then EVAL on NOSCRIPT); several are pipelined, one round
// trip, and a call refused NOSCRIPT (the node's script cache was flushed:
// it ran nothing) is Run again, which loads the script.
func runCalls(ctx context.Context, client redis.UniversalClient, script *redis.Script, keys [][]string, args [][]any) ([]string, []error) {
	replies, errs := make([]string, len(keys)), make([]error, len(keys))
	if len(keys) == 1 {
		replies[0], errs[0] = script.Run(ctx, client, keys[0], args[0]...).Text()
		return replies, errs
	}
	pipe := client.Pipeline()
	cmds := make([]*redis.Cmd, len(keys))
	for i := range keys {
		cmds[i] = pipe.EvalSha(ctx, script.Hash(), keys[i], args[i]...)
	}
	_, _ = pipe.Exec(ctx) // errors are per command, below
	for i := range keys {
		replies[i], errs[i] = cmds[i].Text()
		if redis.HasErrorPrefix(errs[i], "NOSCRIPT") { // as go-redis's Script.Run tells it
			replies[i], errs[i] = script.Run(ctx, client, keys[i], args[i]...).Text()
		}
	}
	return replies, errs
}
