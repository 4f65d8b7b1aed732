package cascade

import (
	"container/heap"
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// held are the decisions of one endpoint waiting for their reports,
// bounded in age, in number, and in number per tenant. A tenant at its
// bound drops its own oldest; when all are at the bound, the tenant
// holding the most drops its oldest. So a tenant's flood drops only its
// own decisions, and a tenant holding fewer than any other keeps its own.
type held struct {
	mu      sync.Mutex
	byID    map[string]*heldDecision
	all     heldQueue // every held decision, oldest first
	tenants map[string]*heldTenant
	largest tenantHeap // the tenants, the one holding the most first
}

type heldDecision struct {
	id      string
	held    *engine.Held
	costs   []int // the reconciling costs counted on the path (h.Costs indices)
	expires time.Time
	tenant  string
	links   [2]heldLinks // in held.all, and in its tenant's queue
}

// heldLinks are a decision's neighbours in one queue.
type heldLinks struct{ older, newer *heldDecision }

// heldQueue is a queue of held decisions linked through their links[k],
// from which any may be removed.
type heldQueue struct {
	k              int
	oldest, newest *heldDecision
	n              int
}

func (q *heldQueue) push(hd *heldDecision) {
	hd.links[q.k] = heldLinks{older: q.newest}
	if q.newest != nil {
		q.newest.links[q.k].newer = hd
	} else {
		q.oldest = hd
	}
	q.newest = hd
	q.n++
}

func (q *heldQueue) remove(hd *heldDecision) {
	l := hd.links[q.k]
	if l.older != nil {
		l.older.links[q.k].newer = l.newer
	} else {
		q.oldest = l.newer
	}
	if l.newer != nil {
		l.newer.links[q.k].older = l.older
	} else {
		q.newest = l.older
	}
	hd.links[q.k] = heldLinks{}
	q.n--
}

// heldTenant is one tenant's held decisions.
type heldTenant struct {
	name  string
	queue heldQueue
	index int // in held.largest
}

// tenantHeap orders tenants by how many decisions they hold, most first
// (container/heap).
type tenantHeap []*heldTenant

func (t tenantHeap) Len() int           { return len(t) }
func (t tenantHeap) Less(i, j int) bool { return t[i].queue.n > t[j].queue.n }
func (t tenantHeap) Swap(i, j int) {
	t[i], t[j] = t[j], t[i]
	t[i].index, t[j].index = i, j
}
func (t *tenantHeap) Push(x any) { x.(*heldTenant).index = len(*t); *t = append(*t, x.(*heldTenant)) }
func (t *tenantHeap) Pop() any {
	old := *t
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*t = old[:len(old)-1]
	return x
}

// add holds hd until its expiry, within c's bounds (dropping expired
// decisions first, then as the type says).
func (p *held) add(hd *heldDecision, c *ForwardedConfig, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tenants == nil {
		p.tenants = map[string]*heldTenant{}
		p.all.k, p.byID = 0, map[string]*heldDecision{}
	}
	for p.all.oldest != nil && now.After(p.all.oldest.expires) {
		p.remove(p.all.oldest)
	}
	if t := p.tenants[hd.tenant]; t != nil && t.queue.n >= c.MaxHeldPerTenant {
		p.remove(t.queue.oldest)
	}
	for len(p.byID) >= c.MaxHeld && len(p.largest) > 0 {
		victim := p.largest[0]
		if t := p.tenants[hd.tenant]; t != nil && t.queue.n == victim.queue.n {
			victim = t // of two holding as many, the one adding drops its own
		}
		p.remove(victim.queue.oldest)
	}
	t := p.tenants[hd.tenant]
	if t == nil {
		t = &heldTenant{name: hd.tenant, queue: heldQueue{k: 1}}
		p.tenants[hd.tenant] = t
		heap.Push(&p.largest, t)
	}
	p.byID[hd.id] = hd
	p.all.push(hd)
	t.queue.push(hd)
	heap.Fix(&p.largest, t.index)
}

// remove drops hd (held); the lock is held.
func (p *held) remove(hd *heldDecision) {
	delete(p.byID, hd.id)
	p.all.remove(hd)
	t := p.tenants[hd.tenant]
	t.queue.remove(hd)
	if t.queue.n == 0 {
		heap.Remove(&p.largest, t.index)
		delete(p.tenants, t.name)
	} else {
		heap.Fix(&p.largest, t.index)
	}
}

// take removes the held decision id and returns it, or nil when it is
// unknown, expired or already reported.
func (p *held) take(id string, now time.Time) *heldDecision {
	p.mu.Lock()
	defer p.mu.Unlock()
	hd := p.byID[id]
	if hd == nil {
		return nil
	}
	p.remove(hd)
	if now.After(hd.expires) {
		return nil
	}
	return hd
}

// hold keeps d for its report and names it in the answer's
// Cascade-Decision header, when some cost on d's path reconciles.
func (h *Handler) hold(hdr http.Header, d *decision) {
	var costs []int
	for i, c := range h.Costs {
		if c.Reconcile != nil && slices.ContainsFunc(d.Buckets, func(b hierarchy.Bucket) bool { return b.Limit.Dimension == c.Dimension }) {
			costs = append(costs, i)
		}
	}
	if len(costs) == 0 || len(d.Buckets) == 0 {
		return
	}
	hd := h.engine.Hold(&d.Decision)
	if hd == nil {
		return
	}
	var b [18]byte
	_, _ = rand.Read(b[:])
	id := base64.RawURLEncoding.EncodeToString(b[:])
	now := time.Now()
	h.pending.add(&heldDecision{id: id, held: hd, costs: costs, tenant: tenantOf(d.Buckets),
		expires: now.Add(time.Duration(h.Forwarded.ReportTTL))}, h.Forwarded, now)
	hdr.Set(decisionHeader, id)
}

// tenantOf names the tenant of a decision's path as the store shards it:
// the hash tag of its last bucket's key, "{tree|tier=value}", whose value
// is that of the first tier keyed on a placeholder (a copy: the key
// shares its plan's memory).
func tenantOf(buckets []hierarchy.Bucket) string {
	key := buckets[len(buckets)-1].Key
	if i := strings.IndexByte(key, '}'); i > 0 {
		key = key[:i+1]
	}
	return strings.Clone(key)
}
