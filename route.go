package cascade

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
)

// StoreRoute sends the paths of some tenants to a store of their own
// (Handler.Stores): every bucket of such a path lives there, and every
// store call for it goes there, so that one tenant's load or a failure of
// its store stays with that tenant.
type StoreRoute struct {
	// Tier is a tenant tier: the first tier of a tree whose key has a
	// placeholder (its value names the tenant; its subtree is one hash
	// tag). Every tree of the handler must have this tenant tier, keyed by
	// the same placeholder: a request's buckets across its trees are
	// decided in one store.
	Tier string `json:"tier"`
	// Values are the tenants routed.
	Values []string `json:"values"`
	// Store names one of Handler.Stores.
	Store string `json:"store"`
	// OnStoreError is what a failure of that store does to these tenants'
	// requests: deny (503), allow, or local (decided in memory on each
	// limit's local share); default the handler's on_store_error.
	OnStoreError string `json:"on_store_error,omitempty"`
}

// provisionRoutes opens the stores that routes name and returns the
// engine's routes. It needs the trees compiled. The stores' pool keys are
// kept for Cleanup.
func (h *Handler) provisionRoutes(ctx caddy.Context) ([]engine.Route, bool, error) {
	if len(h.Routes) == 0 {
		var unused []string
		for _, name := range keysOf(h.Stores) {
			if !slices.ContainsFunc(h.Entitlements, func(c *EntitlementsConfig) bool { return c.Source.RedisStore == name }) {
				unused = append(unused, name)
			}
		}
		if len(unused) > 0 {
			return nil, false, fmt.Errorf("stores %v are named but no route or entitlements source uses them: add route <tier> <value...> <store>, or source redis <key template> store <store>", unused)
		}
		return nil, false, nil
	}
	var routes []engine.Route
	local := false
	routed := map[string]string{} // tenant tag → store
	for _, rt := range h.Routes {
		sc := h.Stores[rt.Store]
		if sc == nil {
			return nil, false, fmt.Errorf("route %s %s: no store named %q: name one with store redis %s { ... } (stores: %v)", rt.Tier, strings.Join(rt.Values, " "), rt.Store, rt.Store, keysOf(h.Stores))
		}
		if sc.Redis == nil {
			return nil, false, fmt.Errorf("store %s: a route's store is a Redis store (a memory store is this process's: nothing to isolate)", rt.Store)
		}
		switch rt.OnStoreError {
		case "", "deny", "allow":
		case "local":
			if sc.Redis == nil {
				return nil, false, fmt.Errorf("route %s: on_store_error local decides in memory when Redis cannot: store %s is no Redis store", rt.Store, rt.Store)
			}
			local = true
		default:
			return nil, false, fmt.Errorf("route %s: on_store_error %q: use deny, allow or local", rt.Store, rt.OnStoreError)
		}
		if len(rt.Values) == 0 {
			return nil, false, fmt.Errorf("route %s: give the values of tier %s to route", rt.Store, rt.Tier)
		}
		// Every tree of the handler must have this tenant tier, keyed
		// alike: a request's path across trees is decided in one store,
		// and a bucket of a tree without it (another tenant's, an IP's)
		// would live in one store for some requests and in another for
		// others — counted twice.
		tenants := map[string]bool{}
		key := ""
		for _, t := range h.trees {
			tier := tenantTier(&t.Tree)
			if tier == nil || tier.Name != rt.Tier {
				return nil, false, fmt.Errorf("route %s: tree %s's tenant tier is not %s (a tree's tenant tier is its first tier keyed by a placeholder: its value names the tenant, whose whole subtree a store holds); every tree of a handler with routes needs the same tenant tier", rt.Store, t.Name, rt.Tier)
			}
			if key != "" && tier.Key != key {
				return nil, false, fmt.Errorf("route %s: the trees' %s tiers are keyed by %s and %s: routed tenants need one key", rt.Store, rt.Tier, key, tier.Key)
			}
			key = tier.Key
			for _, v := range rt.Values {
				tag := "{" + t.Name + "|" + rt.Tier + "=" + hierarchy.Escape(v) + "}"
				if other, dup := routed[tag]; dup {
					return nil, false, fmt.Errorf("route %s: %s %s is routed twice (to %s too)", rt.Store, rt.Tier, v, other)
				}
				routed[tag] = rt.Store
				tenants[tag] = true
			}
		}
		if len(tenants) == 0 {
			return nil, false, fmt.Errorf("route %s: the handler has no tree", rt.Store)
		}
		o, err := sc.Open(ctx, time.Duration(h.SweepInterval))
		if err != nil {
			return nil, false, fmt.Errorf("store %s: %w", rt.Store, err)
		}
		h.stores.routeKeys = append(h.stores.routeKeys, o.PoolKey)
		routes = append(routes, engine.Route{Name: rt.Store + " (" + o.Name + ")", Store: o.Store, Tenants: tenants, OnError: rt.OnStoreError})
	}
	return routes, local, nil
}

// tenantTier is a tree's first tier keyed by a placeholder, nil if none.
func tenantTier(t *hierarchy.Tree) *hierarchy.Tier {
	for _, tier := range t.Tiers {
		if tier.Dynamic() {
			return tier
		}
	}
	return nil
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
