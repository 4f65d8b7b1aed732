package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
)

// fingerprintKey holds, after the key prefix, the secret under which the
// instances sharing a Redis store fingerprint sensitive values (see
// engine.Fingerprints).
const fingerprintKey = "fingerprint_secret"

// FingerprintSecret returns the secret of the instances sharing r: read
// from Redis, where the first instance to ask wrote a random one (SET NX,
// so concurrent first instances agree on one). It has no TTL: a new secret
// would change every fingerprint that support correlates by.
func (r *Redis) FingerprintSecret(ctx context.Context) ([]byte, error) {
	key := r.prefix + fingerprintKey
	fresh := make([]byte, 32)
	if _, err := rand.Read(fresh); err != nil {
		return nil, fmt.Errorf("fingerprint secret: %w", err)
	}
	if err := r.client.SetNX(ctx, key, hex.EncodeToString(fresh), 0).Err(); err != nil {
		return nil, fmt.Errorf("fingerprint secret: writing %s: %w", key, err)
	}
	s, err := r.client.Get(ctx, key).Result()
	if err != nil {
		return nil, fmt.Errorf("fingerprint secret: reading %s: %w", key, err)
	}
	if len(s) < 32 {
		return nil, fmt.Errorf("fingerprint secret: %s holds %d bytes, fewer than 32: delete it, and a new secret is made", key, len(s))
	}
	return []byte(s), nil
}
