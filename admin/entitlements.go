package admin

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/hierarchy"
	"github.com/caddy-cascade/cascade/running"
)

// Runtime entitlements: an operator's answer for one value of an
// entitlements block (a plan, limits of its own), which wins over the
// block's source. They are written, as overrides are, to the stores of
// the handlers that have the block (package running says which), so that
// every instance sharing a store applies them.

func handleEntitlements(w http.ResponseWriter, r *http.Request) error {
	parts, err := segments(r, "/rate_limit/entitlements/")
	if err != nil {
		return err
	}
	switch len(parts) {
	case 0:
		if err := method(r, http.MethodGet); err != nil {
			return err
		}
		return writeJSON(w, listEntitlements())
	case 1:
		return handleEntitlementByBody(w, r, parts[0])
	case 2:
		if err := method(r, http.MethodGet, http.MethodPut, http.MethodDelete); err != nil {
			return err
		}
		return handleEntitlement(w, r, parts[0], parts[1], true)
	}
	return apiError(http.StatusBadRequest, "use /rate_limit/entitlements/<name> with the value in the body, or /rate_limit/entitlements/<name>/<value>, each part escaped (a '/' in a value as %%2F)")
}

// listEntitlements returns the runtime entitlements of every store of the
// running configuration, each store's sorted by name and value.
func listEntitlements() []*control.Entitlement {
	out := []*control.Entitlement{}
	all := active()
	for _, rt := range runtimes(all) {
		es := enginesOf(all, rt)
		for _, en := range rt.Snapshot().Entitlements() {
			out = append(out, showEntitlement(es, en))
		}
	}
	return out
}

// handleEntitlementByBody serves /rate_limit/entitlements/<name>, the
// value named in the JSON body: PUT takes an EntitlementRequest, DELETE
// {"value": "…"}.
func handleEntitlementByBody(w http.ResponseWriter, r *http.Request, name string) error {
	if err := method(r, http.MethodPut, http.MethodDelete); err != nil {
		return err
	}
	if r.Method == http.MethodPut {
		return handleEntitlement(w, r, name, "", false)
	}
	var req struct {
		Value *string `json:"value"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Value == nil {
		return apiError(http.StatusBadRequest, `name the value: {"value": "…"}`)
	}
	return handleEntitlement(w, r, name, *req.Value, true)
}

// handleEntitlement serves one runtime entitlement: value is the path's or
// the body's (inPath false: a PUT whose body names it).
func handleEntitlement(w http.ResponseWriter, r *http.Request, name, value string, inPath bool) error {
	es, err := withEntitlements(name)
	if err != nil {
		return err
	}
	rts := runtimes(es)
	if len(rts) == 0 {
		return apiError(http.StatusInternalServerError, "entitlements %s has no runtime state", name)
	}
	switch r.Method {
	case http.MethodGet:
		en := rts[0].Snapshot().Entitlement(name, value)
		if en == nil {
			return apiError(http.StatusNotFound, "no runtime entitlement of %s/%q: its source answers for it", name, showEntitled(es, name, value))
		}
		return writeJSON(w, showEntitlement(es, en))
	case http.MethodDelete:
		var change Change[control.Entitlement]
		for _, rt := range rts {
			old, err := rt.DeleteEntitlement(r.Context(), name, value)
			if err != nil {
				return errorOf(showEntitledError(es, name, value, err), "deleting the entitlement")
			}
			if old != nil {
				change.Old = showEntitlement(es, old)
			}
		}
		return writeJSON(w, change)
	}
	var pathValue *string
	if inPath {
		pathValue = &value
	}
	en, err := entitlementOf(r, name, pathValue, time.Now())
	if err != nil {
		return err
	}
	value = en.Value
	if err := checkPlan(es, name, en.Plan); err != nil {
		return err
	}
	var change Change[control.Entitlement]
	for _, rt := range rts {
		old, err := rt.SetEntitlement(r.Context(), en)
		if err != nil {
			return errorOf(showEntitledError(es, name, value, err), "setting the entitlement")
		}
		if old != nil {
			change.Old = showEntitlement(es, old)
		}
	}
	change.New = rts[0].Snapshot().Entitlement(name, value)
	if change.New == nil {
		change.New = en
	}
	change.New = showEntitlement(es, change.New)
	return writeJSON(w, change)
}

// entitlementOf reads the entitlement of value in the block name that r's
// body (an EntitlementRequest) asks for, as of now; what it returns is
// still to be checked (Runtime.SetEntitlement, checkPlan). value is the
// path's; nil when the path names only the block, and the body names the
// value.
func entitlementOf(r *http.Request, name string, value *string, now time.Time) (*control.Entitlement, error) {
	var req EntitlementRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	value, err := bodyValue(value, req.Value, `{"value": "…", "plan": …}`, "/rate_limit/entitlements/<name>/<value>")
	if err != nil {
		return nil, err
	}
	en := &control.Entitlement{Name: name, Value: *value, Plan: req.Plan, Limits: req.Limits, Note: req.Note}
	if en.Expires, err = parseExpires(req.Expires, now); err != nil {
		return nil, err
	}
	return en, nil
}

// withEntitlements returns the running engines of the handlers that have
// the entitlements block name, or a 404 that lists the blocks there are.
func withEntitlements(name string) ([]*engine.Engine, error) {
	if name == "" {
		return nil, apiError(http.StatusBadRequest, "no entitlements block: say which, e.g. /rate_limit/entitlements/%s/<value>", entitlementNames()[0])
	}
	var out []*engine.Engine
	for _, e := range active() {
		if blockOf(e, name) != nil {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, apiError(http.StatusNotFound, "no entitlements block %q in the running configuration: its entitlements blocks are %s", name, strings.Join(entitlementNames(), ", "))
	}
	return out, nil
}

// blockOf is e's registration of the entitlements block name, nil when
// its handler has none.
func blockOf(e *engine.Engine, name string) *running.Entitlements {
	bs := running.EntitlementsOf(e)
	if i := slices.IndexFunc(bs, func(b running.Entitlements) bool { return b.Name == name }); i >= 0 {
		return &bs[i]
	}
	return nil
}

func entitlementNames() []string {
	var names []string
	for _, e := range active() {
		for _, b := range running.EntitlementsOf(e) {
			if !slices.Contains(names, b.Name) {
				names = append(names, b.Name)
			}
		}
	}
	if len(names) == 0 {
		return []string{"(none: no rate_limit handler has an entitlements block)"}
	}
	slices.Sort(names)
	return names
}

// checkPlan refuses a plan that no handler having the block knows, when
// each says which it knows (running.Entitlements.Plans): a plan a tree
// does not know would run the value on the tree's default plan.
func checkPlan(es []*engine.Engine, name, plan string) error {
	if plan == "" {
		return nil
	}
	var known []string
	for _, e := range es {
		b := blockOf(e, name)
		if b == nil {
			continue
		}
		if b.Plans == nil || slices.Contains(b.Plans, plan) {
			return nil
		}
		known = append(known, b.Plans...)
	}
	if len(known) == 0 {
		return apiError(http.StatusBadRequest, "plan %q: the trees of entitlements %s have no plans: give the value its own limits instead", plan, name)
	}
	slices.Sort(known)
	return apiError(http.StatusBadRequest, "plan %q: the trees of entitlements %s know no such plan: use %s", plan, name, strings.Join(slices.Compact(known), ", "))
}

// showEntitled is what the API shows of value v of the entitlements block
// name: as the tier the block looks values up by shows them, by every one
// of es that has the block (a fingerprint if any shows one); a
// fingerprint when none has it (an entitlement left from another
// configuration).
func showEntitled(es []*engine.Engine, name, v string) string {
	return showBy(es, v, func(e *engine.Engine) *hierarchy.Tier {
		if b := blockOf(e, name); b != nil {
			if t := e.Tree(b.Tree); t != nil {
				ti, _ := t.Tier(b.Tier)
				return ti
			}
		}
		return nil
	})
}

// showEntitlement returns en as the API shows it: a copy with its value
// as showEntitled shows it; nil stays nil.
func showEntitlement(es []*engine.Engine, en *control.Entitlement) *control.Entitlement {
	if en == nil {
		return nil
	}
	c := *en
	c.Value = showEntitled(es, en.Name, en.Value)
	return &c
}

// showEntitledError returns err with value v of the block name
// fingerprinted in its message where the block's tier is sensitive.
func showEntitledError(es []*engine.Engine, name, v string, err error) error {
	for _, e := range es {
		if b := blockOf(e, name); b != nil {
			err = showError(e, b.Tree, b.Tier, v, err)
		}
	}
	return err
}
