package cost

import (
	"container/list"
	"sync"

	"github.com/vektah/gqlparser/v2/ast"
)

// Bounds of the GraphQL document cache: a cached document's AST is about ten
// times the size of its text, so 1 MiB of text is about 10 MiB of memory.
const (
	maxCachedQuery = 16 << 10
	maxCachedBytes = 1 << 20
)

// docCache is a small LRU cache of parsed GraphQL documents, keyed by the
// query text. A nil *docCache is a cache that never hits.
type docCache struct {
	mu       sync.Mutex
	max      int // entries
	maxQuery int // bytes of one query
	maxBytes int // bytes of all queries
	bytes    int
	ll       *list.List // front: most recently used
	m        map[string]*list.Element
}

type docEntry struct {
	query string
	doc   *ast.QueryDocument
}

func newDocCache(entries, maxQuery, maxBytes int) *docCache {
	return &docCache{max: entries, maxQuery: maxQuery, maxBytes: maxBytes, ll: list.New(), m: map[string]*list.Element{}}
}

func (c *docCache) get(query string) *ast.QueryDocument {
	if c == nil || len(query) > c.maxQuery {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[query]
	if e == nil {
		return nil
	}
	c.ll.MoveToFront(e)
	return e.Value.(*docEntry).doc
}

func (c *docCache) put(query string, doc *ast.QueryDocument) {
	if c == nil || len(query) > c.maxQuery {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.m[query]; e != nil {
		c.ll.MoveToFront(e)
		return
	}
	c.m[query] = c.ll.PushFront(&docEntry{query: query, doc: doc})
	c.bytes += len(query)
	for c.ll.Len() > c.max || c.bytes > c.maxBytes {
		old := c.ll.Back()
		ent := old.Value.(*docEntry)
		c.ll.Remove(old)
		delete(c.m, ent.query)
		c.bytes -= len(ent.query)
	}
}
