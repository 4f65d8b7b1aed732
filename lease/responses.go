package lease

import (
	"context"
	"errors"
	"time"

	"github.com/caddy-cascade/cascade/store"
)

// errNoResponses is the error of Response and KeepResponse when the inner
// store does not keep responses.
var errNoResponses = errors.New("lease: the store cannot keep responses")

// Response implements store.Responses: the inner store's, unleased (a
// response is not limit state).
func (s *Store) Response(ctx context.Context, key string) ([]byte, int64, error) {
	rs, ok := s.inner.(store.Responses)
	if !ok {
		return nil, 0, errNoResponses
	}
	return rs.Response(ctx, key)
}

// KeepResponse implements store.Responses: the inner store's.
func (s *Store) KeepResponse(ctx context.Context, key string, response []byte, ttl time.Duration) error {
	rs, ok := s.inner.(store.Responses)
	if !ok {
		return errNoResponses
	}
	return rs.KeepResponse(ctx, key, response, ttl)
}

var _ store.Responses = (*Store)(nil)
