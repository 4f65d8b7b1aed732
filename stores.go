package cascade

import (
	"github.com/caddy-cascade/cascade/app"
	"github.com/caddy-cascade/cascade/storeconfig"
)

// The store configuration lives in package storeconfig, and the cascade
// app (one per process: the adaptive controller, its shared factor, the
// rate limit service) in package app, which registers it; these names keep
// the Go API as it was.
type (
	App            = app.App
	AdaptiveConfig = app.AdaptiveConfig
	RLSConfig      = app.RLSConfig
	RLSDomain      = app.RLSDomain

	StoreConfig       = storeconfig.Config
	MemoryStoreConfig = storeconfig.Memory
	RedisStoreConfig  = storeconfig.Redis
	RedisLease        = storeconfig.Lease
	RedisBreaker      = storeconfig.Breaker
	RedisTLS          = storeconfig.TLS
)
