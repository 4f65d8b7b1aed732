// Package admin is Cascade's admin API, `admin.api.rate_limit`, served on
// Caddy's admin endpoint (and so behind its access control: local by
// default, remote admin with mTLS where configured), and the
// `caddy rate-limit` command that calls it.
//
//	GET    /rate_limit/trees                               the running trees, with the overrides in force
//	GET    /rate_limit/buckets?tree=T&<tier>=<value>…      one path's buckets, read without charging
//	POST   /rate_limit/reset?tree=T&<tier>=<value>…        make them full again (&below=1: the subtree)
//	GET    /rate_limit/overrides                           the runtime overrides and modes
//	PUT    /rate_limit/overrides/<tree>/<tier>/<value>     set a value's limits (OverrideRequest)
//	DELETE /rate_limit/overrides/<tree>/<tier>/<value>     back to the configuration's
//	PUT    /rate_limit/mode/<tree>                         enforce, warn or shadow (ModeRequest)
//	DELETE /rate_limit/mode/<tree>                         back to the configured mode
//	GET    /rate_limit/entitlements                        the runtime entitlements
//	PUT    /rate_limit/entitlements/<name>/<value>         set a value's plan (EntitlementRequest)
//	DELETE /rate_limit/entitlements/<name>/<value>         back to the entitlements source's answer
//	GET    /rate_limit/top?n=N                             the most-denied keys
//	GET    /rate_limit/status                              the stores' breakers and leases, the adaptive factor
//	GET    /rate_limit/ui                                  a status page of all the above (ui.go)
//
// The API operates on the engines of the running configuration's
// rate_limit handlers, which register them (package running). Overrides,
// modes and entitlements are written to the engines' stores through
// package control, so every instance sharing a Redis applies them, and the
// memory store keeps them across reloads. A value that may be a secret
// can be named in the JSON body instead of the path, which Caddy's admin
// log records: PUT and DELETE /rate_limit/overrides/<tree>/<tier> and
// /rate_limit/entitlements/<name> with {"value": "…", …}.
package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/caddy-cascade/cascade/control"
	"github.com/caddy-cascade/cascade/engine"
	"github.com/caddy-cascade/cascade/topk"
)

func init() {
	caddy.RegisterModule(API{})
}

// Interface guards.
var (
	_ caddy.Module      = API{}
	_ caddy.AdminRouter = API{}
)

// API is the admin API module, admin.api.rate_limit. It has no
// configuration: Caddy loads every admin.api module by itself.
type API struct{}

// CaddyModule returns the Caddy module information.
func (API) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "admin.api.rate_limit", New: func() caddy.Module { return new(API) }}
}

// Routes implements caddy.AdminRouter.
func (API) Routes() []caddy.AdminRoute {
	return []caddy.AdminRoute{
		{Pattern: "/rate_limit/trees", Handler: caddy.AdminHandlerFunc(handleTrees)},
		{Pattern: "/rate_limit/buckets", Handler: caddy.AdminHandlerFunc(handleBuckets)},
		{Pattern: "/rate_limit/reset", Handler: caddy.AdminHandlerFunc(handleReset)},
		{Pattern: "/rate_limit/overrides", Handler: caddy.AdminHandlerFunc(handleOverrides)},
		{Pattern: "/rate_limit/overrides/", Handler: caddy.AdminHandlerFunc(handleOverrides)},
		{Pattern: "/rate_limit/mode/", Handler: caddy.AdminHandlerFunc(handleMode)},
		{Pattern: "/rate_limit/entitlements", Handler: caddy.AdminHandlerFunc(handleEntitlements)},
		{Pattern: "/rate_limit/entitlements/", Handler: caddy.AdminHandlerFunc(handleEntitlements)},
		{Pattern: "/rate_limit/top", Handler: caddy.AdminHandlerFunc(handleTop)},
		{Pattern: "/rate_limit/status", Handler: caddy.AdminHandlerFunc(handleStatus)},
		{Pattern: "/rate_limit/ui", Handler: caddy.AdminHandlerFunc(handleUI)},
		{Pattern: "/rate_limit/ui/", Handler: caddy.AdminHandlerFunc(handleUIAsset)},
	}
}

// maxBody bounds a request body: an override is a few hundred bytes.
const maxBody = 64 << 10

// apiError is an error of the caller's: status, and a message saying what
// to fix.
func apiError(status int, format string, args ...any) error {
	return caddy.APIError{HTTPStatus: status, Err: fmt.Errorf(format, args...)}
}

func method(r *http.Request, allowed ...string) error {
	if slices.Contains(allowed, r.Method) {
		return nil
	}
	return apiError(http.StatusMethodNotAllowed, "%s is not allowed here: use %s", r.Method, strings.Join(allowed, " or "))
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func handleTrees(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	trees := []Tree{}
	seen := map[string]bool{}
	for _, e := range active() {
		for _, t := range describe(e) {
			// Handlers that share a store and name a tree alike share its
			// buckets: one tree.
			if id := t.Store + "\x00" + t.Name; !seen[id] {
				seen[id] = true
				trees = append(trees, t)
			}
		}
	}
	return writeJSON(w, trees)
}

// withTree returns the running engines that have the tree, or a 404 that
// lists the trees there are.
func withTree(name string) ([]*engine.Engine, error) {
	if name == "" {
		return nil, apiError(http.StatusBadRequest, "no tree: say which, e.g. ?tree=%s", treeNames()[0])
	}
	var out []*engine.Engine
	for _, e := range active() {
		if e.Tree(name) != nil {
			out = append(out, e)
		}
	}
	if len(out) == 0 {
		return nil, apiError(http.StatusNotFound, "no tree %q in the running configuration: its trees are %s", name, strings.Join(treeNames(), ", "))
	}
	return out, nil
}

func treeNames() []string {
	var names []string
	for _, e := range active() {
		for _, t := range describe(e) {
			if !slices.Contains(names, t.Name) {
				names = append(names, t.Name)
			}
		}
	}
	if len(names) == 0 {
		return []string{"(none: no rate_limit handler is loaded)"}
	}
	slices.Sort(names)
	return names
}

// reserved are the query parameters that are not a tier's value; a tier
// of one of these names is given as tier.<name>=<value>.
var reserved = []string{"tree", "cost", "below", "n"}

// pathValues reads the tiers' values of a query: <tier>=<value> or
// tier.<tier>=<value>, each tier once.
func pathValues(q url.Values) (map[string]string, error) {
	values := map[string]string{}
	for name, vs := range q {
		tier := name
		switch {
		case strings.HasPrefix(name, "tier."):
			tier = name[len("tier."):]
		case slices.Contains(reserved, name), strings.HasPrefix(name, "cost."):
			continue
		}
		if len(vs) != 1 {
			return nil, apiError(http.StatusBadRequest, "tier %s is given %d times: give each tier one value", tier, len(vs))
		}
		values[tier] = vs[0]
	}
	return values, nil
}

// pathRequest is what the bucket and reset calls are given: the query, the
// engines of its tree, and the path's value of each tier.
type pathRequest struct {
	q       url.Values
	engines []*engine.Engine
	values  map[string]string
}

// readPath checks r's method against allowed and reads its query's tree and
// tier values.
func readPath(w http.ResponseWriter, r *http.Request, allowed ...string) (pathRequest, error) {
	if err := method(r, allowed...); err != nil {
		return pathRequest{}, err
	}
	q, err := query(w, r)
	if err != nil {
		return pathRequest{}, err
	}
	es, err := withTree(q.Get("tree"))
	if err != nil {
		return pathRequest{}, err
	}
	values, err := pathValues(q)
	if err != nil {
		return pathRequest{}, err
	}
	return pathRequest{q: q, engines: es, values: values}, nil
}

func handleBuckets(w http.ResponseWriter, r *http.Request) error {
	p, err := readPath(w, r, http.MethodGet, http.MethodPost)
	if err != nil {
		return err
	}
	q := p.q
	cost := Cost{Default: 1, Dims: map[string]int64{}}
	for name, vs := range q {
		dim, isCost := strings.CutPrefix(name, "cost")
		if !isCost || (dim != "" && dim[0] != '.') {
			continue
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if len(vs) != 1 || err != nil || n < 0 {
			return apiError(http.StatusBadRequest, "%s=%s: give one whole number, 0 or more", name, strings.Join(vs, ","))
		}
		if dim == "" {
			cost.Default = n
		} else {
			cost.Dims[dim[1:]] = n
		}
	}
	b, err := inspect(r, p.engines[0], q.Get("tree"), p.values, cost)
	if err != nil {
		return err
	}
	return writeJSON(w, b)
}

func handleReset(w http.ResponseWriter, r *http.Request) error {
	p, err := readPath(w, r, http.MethodPost)
	if err != nil {
		return err
	}
	below := false
	if s := p.q.Get("below"); s != "" {
		if below, err = strconv.ParseBool(s); err != nil {
			return apiError(http.StatusBadRequest, "below=%s: use below=1 to reset the whole subtree, or leave it out", s)
		}
	}
	res, err := reset(r, p.engines[0], p.q.Get("tree"), p.values, below)
	if err != nil {
		return err
	}
	return writeJSON(w, res)
}

// query returns the parameters of a request: its URL's, and for a POST
// those of its form body (application/x-www-form-urlencoded) too. A value
// sent in the body stays out of the request's URI, which Caddy's admin
// endpoint logs: the way to name a sensitive value (an API key).
func query(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	if r.Method != http.MethodPost {
		return r.URL.Query(), nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	if err := r.ParseForm(); err != nil {
		return nil, apiError(http.StatusBadRequest, "the form body: %v: send tier=value pairs URL-encoded, at most %d KiB", err, maxBody>>10)
	}
	return r.Form, nil
}

// segments splits what follows prefix in the request's path into its
// unescaped segments, so that a value may hold '/' (as %2F).
func segments(r *http.Request, prefix string) ([]string, error) {
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if !ok {
		return nil, nil
	}
	if rest == "" {
		return nil, nil
	}
	parts := strings.Split(rest, "/")
	for i, p := range parts {
		s, err := url.PathUnescape(p)
		if err != nil {
			return nil, apiError(http.StatusBadRequest, "path segment %q: %v: escape it as url.PathEscape does", p, err)
		}
		parts[i] = s
	}
	return parts, nil
}

// runtimes returns the distinct runtime states of engines: one per store.
func runtimes(es []*engine.Engine) []*control.Runtime {
	var out []*control.Runtime
	for _, e := range es {
		if rt := e.Config().Runtime; rt != nil && !slices.Contains(out, rt) {
			out = append(out, rt)
		}
	}
	return out
}

// decode reads a JSON body of at most maxBody bytes into v, strictly.
func decode(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return apiError(http.StatusBadRequest, "reading the body: %v", err)
	}
	if len(body) > maxBody {
		return apiError(http.StatusRequestEntityTooLarge, "the body is over %d KiB: an override or a mode is a small JSON object", maxBody>>10)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return apiError(http.StatusBadRequest, "the body is not the JSON expected: %v", err)
	}
	if dec.More() {
		return apiError(http.StatusBadRequest, "the body holds more than one JSON value")
	}
	return nil
}

// overrideOf reads the override of value for tier of tree that r's body
// (an OverrideRequest) asks for, as of now; what it returns is still to
// be checked against the tree (engine.CheckOverride).
//
// value is the path's; nil when the path names only the tree and tier,
// and the body names the value.
func overrideOf(r *http.Request, tree, tier string, value *string, now time.Time) (*control.Override, error) {
	var req OverrideRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	value, err := bodyValue(value, req.Value, `{"value": "…", "limits": …}`, "/rate_limit/overrides/<tree>/<tier>/<value>")
	if err != nil {
		return nil, err
	}
	o := &control.Override{Tree: tree, Tier: tier, Value: *value, Limits: req.Limits, Unlimited: req.Unlimited, Replace: req.Replace, Note: req.Note}
	if o.Expires, err = parseExpires(req.Expires, now); err != nil {
		return nil, err
	}
	return o, nil
}

// bodyValue is the value a change names: the path's, or the body's when
// the path names none (example shows the body, route the path); naming
// two different ones is an error.
func bodyValue(path, body *string, example, route string) (*string, error) {
	switch {
	case path == nil && body == nil:
		return nil, apiError(http.StatusBadRequest, "name the value: %s (or in the path, %s, which Caddy's admin log records)", example, route)
	case path != nil && body != nil && *body != *path:
		return nil, apiError(http.StatusBadRequest, "the body names another value than the path: name it once, in the body")
	case path == nil:
		return body, nil
	}
	return path, nil
}

// parseExpires reads a change's expires: "" for none, else an RFC 3339
// time after now.
func parseExpires(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, apiError(http.StatusBadRequest, "expires %q: write an RFC 3339 time such as %s", s, now.Add(24*time.Hour).UTC().Format(time.RFC3339))
	}
	if !t.After(now) {
		return time.Time{}, apiError(http.StatusBadRequest, "expires %s is in the past: give a future RFC 3339 time, or leave it out", s)
	}
	return t, nil
}

func handleOverrides(w http.ResponseWriter, r *http.Request) error {
	parts, err := segments(r, "/rate_limit/overrides/")
	if err != nil {
		return err
	}
	if len(parts) == 0 {
		if err := method(r, http.MethodGet); err != nil {
			return err
		}
		out := Overrides{Overrides: []*control.Override{}, Modes: []*control.Mode{}}
		all := active()
		for _, rt := range runtimes(all) {
			snap := rt.Snapshot()
			for _, o := range snap.Overrides() {
				out.Overrides = append(out.Overrides, showOverride(enginesOf(all, rt), o))
			}
			out.Modes = append(out.Modes, snap.Modes()...)
		}
		return writeJSON(w, out)
	}
	if len(parts) != 2 && len(parts) != 3 {
		return apiError(http.StatusBadRequest, "use /rate_limit/overrides/<tree>/<tier> with the value in the body, or /rate_limit/overrides/<tree>/<tier>/<value>, each part escaped (a '/' in a value as %%2F)")
	}
	if len(parts) == 2 {
		return handleOverrideByBody(w, r, parts[0], parts[1])
	}
	if err := method(r, http.MethodGet, http.MethodPut, http.MethodDelete); err != nil {
		return err
	}
	return handleOverride(w, r, parts[0], parts[1], parts[2], true)
}

// handleOverrideByBody serves /rate_limit/overrides/<tree>/<tier>, the
// value named in the JSON body: PUT takes an OverrideRequest, DELETE
// {"value": "…"}.
func handleOverrideByBody(w http.ResponseWriter, r *http.Request, tree, tier string) error {
	if err := method(r, http.MethodPut, http.MethodDelete); err != nil {
		return err
	}
	if r.Method == http.MethodPut {
		return handleOverride(w, r, tree, tier, "", false)
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
	return handleOverride(w, r, tree, tier, *req.Value, true)
}

// handleOverride serves one override: value is the path's or the body's
// (inPath false: a PUT whose body names it).
func handleOverride(w http.ResponseWriter, r *http.Request, tree, tier, value string, inPath bool) error {
	es, err := withTree(tree)
	if err != nil {
		return err
	}
	rts := runtimes(es)
	if len(rts) == 0 {
		return apiError(http.StatusInternalServerError, "tree %s has no runtime state", tree)
	}
	switch r.Method {
	case http.MethodGet:
		o := rts[0].Snapshot().Override(tree, tier, value)
		if o == nil {
			return apiError(http.StatusNotFound, "no override of %s/%s/%q", tree, tier, showValue(es, tree, tier, value))
		}
		return writeJSON(w, showOverride(es, o))
	case http.MethodDelete:
		var change Change[control.Override]
		for _, rt := range rts {
			old, err := rt.DeleteOverride(r.Context(), tree, tier, value)
			if err != nil {
				return apiError(http.StatusServiceUnavailable, "deleting the override: %v", showError(es[0], tree, tier, value, err))
			}
			if old != nil {
				change.Old = showOverride(es, old)
			}
		}
		return writeJSON(w, change)
	}
	var pathValue *string
	if inPath {
		pathValue = &value
	}
	o, err := overrideOf(r, tree, tier, pathValue, time.Now())
	if err != nil {
		return err
	}
	value = o.Value
	for _, e := range es {
		if err := e.CheckOverride(o); err != nil {
			return apiError(http.StatusBadRequest, "%v", showError(e, tree, tier, value, err))
		}
	}
	var change Change[control.Override]
	for _, rt := range rts {
		old, err := rt.SetOverride(r.Context(), o)
		if err != nil {
			return errorOf(showError(es[0], tree, tier, value, err), "setting the override")
		}
		if old != nil {
			change.Old = showOverride(es, old)
		}
	}
	change.New = rts[0].Snapshot().Override(tree, tier, value)
	if change.New == nil {
		change.New = o
	}
	change.New = showOverride(es, change.New)
	return writeJSON(w, change)
}

// errorOf turns an error of package control into an API error: a
// validation error is the caller's (400), anything else the store's (503).
func errorOf(err error, doing string) error {
	var invalid *control.InvalidError
	if errors.As(err, &invalid) {
		return apiError(http.StatusBadRequest, "%v", err)
	}
	return apiError(http.StatusServiceUnavailable, "%s: %v", doing, err)
}

func handleMode(w http.ResponseWriter, r *http.Request) error {
	parts, err := segments(r, "/rate_limit/mode/")
	if err != nil {
		return err
	}
	if len(parts) != 1 || parts[0] == "" {
		return apiError(http.StatusBadRequest, "use /rate_limit/mode/<tree>")
	}
	if err := method(r, http.MethodPut, http.MethodDelete); err != nil {
		return err
	}
	tree := parts[0]
	es, err := withTree(tree)
	if err != nil {
		return err
	}
	rts := runtimes(es)
	var change Change[control.Mode]
	if r.Method == http.MethodDelete {
		for _, rt := range rts {
			old, err := rt.DeleteMode(r.Context(), tree)
			if err != nil {
				return errorOf(err, "deleting the mode")
			}
			if old != nil {
				change.Old = old
			}
		}
		return writeJSON(w, change)
	}
	var req ModeRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	switch req.Mode {
	case "enforce", "warn", "shadow":
	default:
		return apiError(http.StatusBadRequest, "mode %q: use enforce, warn or shadow", req.Mode)
	}
	m := &control.Mode{Tree: tree, Mode: req.Mode, Note: req.Note}
	for _, rt := range rts {
		old, err := rt.SetMode(r.Context(), m)
		if err != nil {
			return errorOf(err, "setting the mode")
		}
		if old != nil {
			change.Old = old
		}
	}
	change.New = rts[0].Snapshot().Mode(tree)
	return writeJSON(w, change)
}

func handleTop(w http.ResponseWriter, r *http.Request) error {
	if err := method(r, http.MethodGet); err != nil {
		return err
	}
	n := 20
	if s := r.URL.Query().Get("n"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 || v > 10000 {
			return apiError(http.StatusBadRequest, "n=%s: give a number of keys from 1 to 10000", s)
		}
		n = v
	}
	// A sketch keeps the keys as they are: each is shown by an engine
	// that counts into it and has its tree (engine.ShowKey), so the values
	// of sensitive tiers come out as fingerprints.
	var sketches []*topk.Sketch
	var users [][]*engine.Engine
	for _, e := range active() {
		s := e.Config().Top
		if s == nil {
			continue
		}
		i := slices.Index(sketches, s)
		if i < 0 {
			sketches, users = append(sketches, s), append(users, nil)
			i = len(sketches) - 1
		}
		users[i] = append(users[i], e)
	}
	out := Top{Keys: []TopEntry{}}
	for i, s := range sketches {
		out.Total += s.Total()
		for _, en := range s.Top(0) {
			en.Key = showKey(users[i], en.Key)
			out.Keys = append(out.Keys, topEntry(en))
		}
	}
	slices.SortStableFunc(out.Keys, func(a, b TopEntry) int {
		if a.Count != b.Count {
			if a.Count > b.Count {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	if len(out.Keys) > n {
		out.Keys = out.Keys[:n]
	}
	return writeJSON(w, out)
}

// topEntry decodes a key of the top-K sketch: a bucket's storage key
// without its limit, "{tree|tag}tier=value/tier=value" (values escaped, as
// package hierarchy writes them: percent-encoded, or hashed when long).
func topEntry(e topk.Entry) TopEntry {
	out := TopEntry{Entry: e, Path: []PathValue{}}
	key := e.Key
	if rest, ok := strings.CutPrefix(key, "{"); ok {
		if bar := strings.IndexByte(rest, '|'); bar >= 0 {
			out.Tree = rest[:bar]
		}
		if end := strings.IndexByte(key, '}'); end >= 0 {
			key = key[end+1:]
		}
	}
	for _, seg := range strings.Split(key, "/") {
		tier, v, _ := strings.Cut(seg, "=")
		if u, err := url.PathUnescape(v); err == nil {
			v = u
		}
		out.Path = append(out.Path, PathValue{Tier: tier, Value: v})
		out.Tier = tier
	}
	return out
}
