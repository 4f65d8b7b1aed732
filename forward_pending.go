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

// pendingReports are the decisions of one endpoint waiting for their
// usage reports,
// bounded in age, in number, and in number per tenant. A tenant at its
// bound drops its own oldest; when all are at the bound, the tenant
// holding the most drops its oldest. So a tenant's flood drops only its
// own decisions, and a tenant holding fewer than any other keeps its own.
type pendingReports struct {
	mu      sync.Mutex
	byID    map[string]*pendingDecision
	all     pendingQueue // every pending decision, oldest first
	tenants map[string]*pendingTenant
	largest tenantHeap // the tenants, the one holding the most first
}

type pendingDecision struct {
	id      string
	charge  *engine.Charge
	costs   []int  // the reconciling costs counted on the path (h.Costs indices)
	model   string // the model the request asked for (priced costs)
	expires time.Time
	tenant  string
	links   [2]pendingLinks // in pendingReports.all, and in its tenant's queue
}

// pendingLinks are a decision's neighbours in one queue.
type pendingLinks struct{ older, newer *pendingDecision }

// pendingQueue is a queue of pending decisions linked through their links[k],
// from which any may be removed.
type pendingQueue struct {
	k              int
	oldest, newest *pendingDecision
	n              int
}

func (q *pendingQueue) push(hd *pendingDecision) {
	hd.links[q.k] = pendingLinks{older: q.newest}
	if q.newest != nil {
		q.newest.links[q.k].newer = hd
	} else {
		q.oldest = hd
	}
	q.newest = hd
	q.n++
}

func (q *pendingQueue) remove(hd *pendingDecision) {
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
	hd.links[q.k] = pendingLinks{}
	q.n--
}

// pendingTenant is one tenant's pending decisions.
type pendingTenant struct {
	name  string
	queue pendingQueue
	index int // in pendingReports.largest
}

// tenantHeap orders tenants by how many decisions they hold, most first
// (container/heap).
type tenantHeap []*pendingTenant

func (t tenantHeap) Len() int           { return len(t) }
func (t tenantHeap) Less(i, j int) bool { return t[i].queue.n > t[j].queue.n }
func (t tenantHeap) Swap(i, j int) {
	t[i], t[j] = t[j], t[i]
	t[i].index, t[j].index = i, j
}
func (t *tenantHeap) Push(x any) {
	x.(*pendingTenant).index = len(*t)
	*t = append(*t, x.(*pendingTenant))
}
func (t *tenantHeap) Pop() any {
	old := *t
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*t = old[:len(old)-1]
	return x
}

// add holds hd until its expiry, within c's bounds (dropping expired
// decisions first, then as the type says).
func (p *pendingReports) add(hd *pendingDecision, c *ForwardedConfig, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tenants == nil {
		p.tenants = map[string]*pendingTenant{}
		p.all.k, p.byID = 0, map[string]*pendingDecision{}
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
		t = &pendingTenant{name: hd.tenant, queue: pendingQueue{k: 1}}
		p.tenants[hd.tenant] = t
		heap.Push(&p.largest, t)
	}
	p.byID[hd.id] = hd
	p.all.push(hd)
	t.queue.push(hd)
	heap.Fix(&p.largest, t.index)
}

// remove drops hd (pending); the lock is held.
func (p *pendingReports) remove(hd *pendingDecision) {
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

// take removes the pending decision id and returns it, or nil when it is
// unknown, expired or already reported.
func (p *pendingReports) take(id string, now time.Time) *pendingDecision {
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

// awaitReport keeps d's charge for its report and names it in the answer's
// Cascade-Decision header, when some cost on d's path reconciles.
func (h *Handler) awaitReport(hdr http.Header, d *decision) {
	var costs []int
	for i, c := range h.Costs {
		if c.Reconcile != nil && slices.ContainsFunc(d.Buckets, func(b hierarchy.Bucket) bool { return b.Limit.Dimension == c.Dimension }) {
			costs = append(costs, i)
		}
	}
	if len(costs) == 0 || len(d.Buckets) == 0 {
		return
	}
	c := d.Charge()
	if c == nil {
		return
	}
	var b [18]byte
	_, _ = rand.Read(b[:])
	id := base64.RawURLEncoding.EncodeToString(b[:])
	now := time.Now()
	h.reports.add(&pendingDecision{id: id, charge: c, costs: costs, model: d.model, tenant: tenantOf(d.Buckets),
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
