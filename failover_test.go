package cascade

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddy-cascade/cascade/internal/redistest"
	"github.com/caddy-cascade/cascade/store"
)

// TestClusterFailoverThroughCaddy: Caddy on a real Redis Cluster of 3
// masters and 3 replicas (cluster-node-timeout 1 s), a tree keyed by
// organisation, 60 organisations over the three masters at about 400
// requests a second; one master is SIGKILLed. The organisations of the
// healthy masters get nothing but 200s; the dead master's get 503
// store-unavailable (on_store_error deny) until its replica is promoted,
// and 200s again within a second of the promotion; with the default
// breaker and with breaker off.
func TestClusterFailoverThroughCaddy(t *testing.T) {
	for _, breaker := range []string{"3 1s", "off"} {
		t.Run("breaker "+breaker, func(t *testing.T) {
			c := redistest.StartClusterHA(t, 3, time.Second)
			url := site(t, fmt.Sprintf(`
	tree fo {
		tier org {header.X-Org} {
			limit 1000000/h
		}
	}
	store redis {
		cluster
		address %s
		timeout 2s
		breaker %s
		insecure_bus
	}
	on_store_error deny
`, strings.Join(c.Addrs(), " "), breaker))
			dead := c.Masters[0]
			var orgs []string
			for i := range 60 {
				orgs = append(orgs, fmt.Sprintf("org%d", i))
			}
			// The tenant's hash tag: the tree and the organisation.
			onDead := c.OnMaster(t, dead, orgs, func(org string) int { return store.RedisKeySlot("{fo|org=" + org + "}") })
			type answer struct {
				at     time.Time
				status int
				body   string
			}
			var mu sync.Mutex
			answers := map[string][]answer{}
			stop := make(chan struct{})
			wait := redistest.Drive(stop, func(n int64) {
				org := orgs[n%int64(len(orgs))]
				// Not do: a goroutine must not end the test.
				a := answer{status: -1}
				req, _ := http.NewRequest("GET", url, nil)
				req.Header.Set("X-Org", org)
				if res, err := httpClient(t).Do(req); err != nil {
					a.body = err.Error()
				} else {
					b, _ := io.ReadAll(res.Body)
					res.Body.Close()
					a.status, a.body = res.StatusCode, string(b)
				}
				a.at = time.Now()
				mu.Lock()
				answers[org] = append(answers[org], a)
				mu.Unlock()
			})
			time.Sleep(500 * time.Millisecond) // steady load before the kill
			killed := time.Now()
			dead.Kill()
			var promoted time.Time
			for deadline := time.Now().Add(30 * time.Second); ; {
				if time.Now().After(deadline) {
					close(stop)
					wait()
					t.Fatal("no replica took over the killed master's slots within 30 s")
				}
				time.Sleep(10 * time.Millisecond) // polling the cluster's own state
				if m, _ := c.MasterForSlot(c.Masters[1], store.RedisKeySlot("{fo|org="+onDead[0]+"}")); m != nil && m != dead {
					promoted = time.Now()
					break
				}
			}
			time.Sleep(3 * time.Second)
			close(stop)
			wait()

			var healthyBad, refused, late, servedAfter int
			var last time.Time
			var sample string
			for _, org := range orgs {
				onDeadMaster := slices.Contains(onDead, org)
				for _, a := range answers[org] {
					switch {
					case a.status == 200:
						if onDeadMaster && a.at.After(promoted) {
							servedAfter++
						}
					case !onDeadMaster:
						healthyBad++
						sample = fmt.Sprintf("%s: %d %s", org, a.status, a.body)
					case a.status != 503 || !strings.Contains(a.body, "#store-unavailable"):
						t.Errorf("%s (dead master) got %d %s; want 200 or 503 store-unavailable", org, a.status, a.body)
					default:
						refused++
						if a.at.After(last) {
							last = a.at
						}
						if a.at.After(promoted.Add(time.Second)) {
							late++
							sample = fmt.Sprintf("%s: %d %s", org, a.status, a.body)
						}
					}
				}
			}
			t.Logf("promotion seen %v after the kill; the dead master's %d organisations: %d refused (503), the last %v after the kill, %v after the promotion; the healthy masters' %d: %d not 200",
				promoted.Sub(killed).Round(time.Millisecond), len(onDead), refused, last.Sub(killed).Round(time.Millisecond),
				last.Sub(promoted).Round(time.Millisecond), len(orgs)-len(onDead), healthyBad)
			if healthyBad > 0 {
				t.Errorf("the healthy masters' organisations got %d answers other than 200 (e.g. %s)", healthyBad, sample)
			}
			if refused == 0 {
				t.Error("the dead master's organisations were never refused: was it killed?")
			}
			if late > 0 {
				t.Errorf("%d refusals more than 1s after the promotion (e.g. %s)", late, sample)
			}
			if servedAfter == 0 {
				t.Error("the dead master's organisations were not served after the promotion")
			}
		})
	}
}
