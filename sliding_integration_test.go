package cascade

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestReconcileExactSlidingWindow: on an exact sliding window of tokens,
// reconciliation corrects the very charge of the request it reads usage
// for, on either store (on Redis, through the time Redis decided at): a
// refund returns what was not used, a debt is paid by the next requests,
// exactly, as a sliding window has no refill.
func TestReconcileExactSlidingWindow(t *testing.T) {
	eachStore(t, func(t *testing.T, storeBlock string) {
		up := newFakeLLM(t, 30, 870)
		port := freePort(t)
		startCaddy(t, fmt.Sprintf(`
http://127.0.0.1:%d {
	rate_limit {
		tree llm {
			tier user {header.X-User} {
				limit 3000 tokens/min sliding
			}
		}
		cost tokens llm {
			reconcile {
				provider openai
			}
		}
		headers ietf x_ratelimit retry_after openai
		%s
	}
	reverse_proxy %s
}
`, port, storeBlock, strings.TrimPrefix(up.srv.URL, "http://")))
		url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
		body := fmt.Sprintf(pythagoras, "")

		// bob: estimated 64, used 900: a debt of 836.
		r := post(t, url, body, "X-User: bob")
		if got := remainingTokens(t, r); got != 3000-64 {
			t.Fatalf("bob's first request: remaining %d, want %d", got, 3000-64)
		}
		waitExact(t, url, 3000-900, "X-User: bob")

		// carol: estimated 64, used 14: a refund of 50, off her charge.
		up.setUsage(10, 4)
		r = post(t, url, body, "X-User: carol")
		if got := remainingTokens(t, r); got != 3000-64 {
			t.Fatalf("carol's first request: remaining %d, want %d", got, 3000-64)
		}
		waitExact(t, url, 3000-14, "X-User: carol")
	})
}

// waitExact polls until the window shows want remaining, with probes that
// are refused and so charge nothing: each costs 2,994 tokens (max_tokens
// 2,980), more than the window has left but within the limit's 3,000.
func waitExact(t *testing.T, url string, want int, headers ...string) {
	t.Helper()
	probe := strings.Replace(fmt.Sprintf(pythagoras, ""), `"max_tokens":50`, `"max_tokens":2980`, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		r := post(t, url, probe, headers...)
		if r.status != 429 {
			t.Fatalf("probe: %d %s, want a refusal that charges nothing", r.status, r.body)
		}
		got := remainingTokens(t, r)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("remaining %d, want %d once reconciled", got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
