// Package cost says what a request costs before it goes upstream, and what
// it actually cost once the upstream has answered.
//
// Cascade's limits count in dimensions: "requests" (always 1 per request)
// and any named cost such as "tokens", "points" or "bytes". This package
// computes the second kind. It knows HTTP requests and responses and nothing
// about buckets or stores: the caller charges the estimate, lets the request
// through, and adjusts the charge by actual − estimate.
//
// # Estimating
//
// An [Estimator] turns a request into a number. [Constant], [BodySize] and
// [Header] need nothing clever; [LLM] reads an OpenAI or Anthropic request
// body (input characters / 4 + the maximum output tokens); [GraphQL] computes
// a query's complexity from the query alone, optionally refined by a schema.
//
// Estimators that read the body ([Estimator.NeedsBody]) receive the bytes
// peeked by [PeekBody], which reads at most a bound and re-attaches a body
// that replays every original byte, so the upstream receives exactly what the
// client sent. A request whose body exceeds the bound gets a 413, never a
// free pass; input the estimator cannot read gets a 400 (or, when configured,
// a fixed default cost). Those client errors are [*InputError] values that
// carry what an RFC 9457 problem response needs.
//
// Parsing client input is bounded in time and memory: body bytes, JSON
// nesting, GraphQL tokens, depth, aliases, directives, fragment cycles and
// batch sizes all have limits, and cost arithmetic saturates instead of
// overflowing.
//
// # Reconciling
//
// A [Tap] wraps the response writer. Every write goes straight through to
// the client, unbuffered; a small incremental scanner reads a copy and keeps
// the last usage report it saw: OpenAI and Anthropic "usage" objects in JSON
// bodies and in server-sent event streams, GraphQL "extensions.cost", or a
// response header. [Actual] turns that [Usage] into the charged amount
// (total, input, output, or a weighted sum). When no final report arrives
// (a cut stream, an error body), Found is false and the estimate stands.
//
// # Putting it together
//
// A handler estimates, charges, proxies through a tap, and adjusts:
//
//	est := &cost.LLM{}                        // configured once
//	if err := est.Provision(); err != nil { … }
//
//	req, err := cost.NewRequest(r, est, cost.BodyLimit(est, 1<<20))
//	n, err := est.Estimate(req)               // *cost.InputError → 4xx problem
//	… charge n tokens; deny or continue …
//	tap := cost.NewTap(w, cost.TapConfig{})
//	next.ServeHTTP(tap, r)                    // r.Body still holds every byte
//	if u := tap.Usage(); u.Found {
//		… adjust by actual.Cost(u) − n …
//	}
package cost
