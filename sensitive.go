package cascade

import (
	"context"
	"fmt"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/store"
)

// minFingerprintSecret is the shortest fingerprint_secret accepted: a
// shorter one could be guessed, and with it every fingerprint reversed
// against a list of likely values.
const minFingerprintSecret = 16

// fingerprints returns the fingerprints of the handler's sensitive values:
// under fingerprint_secret when it is set, else under the secret kept in
// its Redis store (redis; nil for the memory store: this process's own).
func (h *Handler) fingerprints(redis *store.Redis) (*engine.Fingerprints, error) {
	if h.FingerprintSecret != "" {
		secret, err := caddy.NewReplacer().ReplaceOrErr(h.FingerprintSecret, true, true)
		if err != nil {
			// The error names the placeholder, never the secret.
			return nil, fmt.Errorf("rate_limit: fingerprint_secret: %w: set the variable, or give the secret itself", err)
		}
		if len(secret) < minFingerprintSecret {
			return nil, fmt.Errorf("rate_limit: fingerprint_secret is %d bytes: give at least %d random bytes, e.g. from 'openssl rand -hex 32', the same on every instance",
				len(secret), minFingerprintSecret)
		}
		return engine.NewFingerprints([]byte(secret), nil, h.logger), nil
	}
	if redis == nil {
		return engine.NewFingerprints(nil, nil, h.logger), nil
	}
	return engine.NewFingerprints(nil, func(ctx context.Context) ([]byte, error) { return redis.FingerprintSecret(ctx) }, h.logger), nil
}
