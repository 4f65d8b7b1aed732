package cascade

import (
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/caddy-cascade/cascade/internal/caddyfileopt"
	"github.com/caddy-cascade/cascade/storeconfig"
)

func (h *Handler) parseStore(d *caddyfile.Dispenser) error {
	if !d.NextArg() {
		return d.Errf("usage: store memory|redis { ... }")
	}
	kind := d.Val()
	if d.NextArg() { // store redis <name> { ... }: a store for routes
		name := d.Val()
		if kind != "redis" {
			return d.Errf("store %s %s: only redis stores are named (for route): a memory store is this process's", kind, name)
		}
		if h.Stores[name] != nil {
			return d.Errf("store redis %s given twice", name)
		}
		if h.Stores == nil {
			h.Stores = map[string]*StoreConfig{}
		}
		r := &RedisStoreConfig{}
		h.Stores[name] = &StoreConfig{Redis: r}
		return storeconfig.ParseRedis(d, r)
	}
	if h.Store != nil {
		return d.Errf("store already configured")
	}
	switch kind {
	case "memory":
		m := &MemoryStoreConfig{}
		h.Store = &StoreConfig{Memory: m}
		for nesting := d.Nesting(); d.NextBlock(nesting); {
			var err error
			switch d.Val() {
			case "name":
				if !d.NextArg() {
					return d.ArgErr()
				}
				m.Name = d.Val()
			case "max_keys":
				m.MaxKeys, err = caddyfileopt.Int(d)
			case "max_replay_bytes":
				m.MaxReplayBytes, err = caddyfileopt.Size(d)
			default:
				return unknownOption(d, "store memory", d.Val(), memoryOptions)
			}
			if err != nil {
				return err
			}
		}
	case "redis":
		r := &RedisStoreConfig{}
		h.Store = &StoreConfig{Redis: r}
		return storeconfig.ParseRedis(d, r)
	default:
		return d.Errf("unknown store %q: use memory (default) or redis", d.Val())
	}
	return nil
}
