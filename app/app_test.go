package app

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestAdaptiveJSONDurations: the cascade app's JSON takes durations as
// Caddy's JSON does everywhere, strings ("2s", "1d") or nanoseconds, and
// names a bad one.
func TestAdaptiveJSONDurations(t *testing.T) {
	var a App
	raw := `{"adaptive":{"interval":"2s","recovery_time":"1d","latency":{"warn":"300ms","critical":1000000000},"floor":0.2}}`
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	c := a.Adaptive.Config
	if c.Interval != 2*time.Second || c.RecoveryTime != 24*time.Hour || c.Latency.Warn != 300*time.Millisecond ||
		c.Latency.Critical != time.Second || c.Floor != 0.2 {
		t.Fatalf("decoded %+v", c)
	}
	for in, want := range map[string]string{
		`{"adaptive":{"interval":"2x"}}`:  "adaptive.interval",
		`{"adaptive":{"intervall":"2s"}}`: "unknown field",
	} {
		if err := json.Unmarshal([]byte(in), new(App)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one naming %q", in, err, want)
		}
	}
	// What the Caddyfile adapter writes (nanoseconds) reads back the same.
	out, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back App
	if err := json.Unmarshal(out, &back); err != nil || !reflect.DeepEqual(back.Adaptive.Config, c) {
		t.Fatalf("round trip of %s: %+v, %v", out, back.Adaptive, err)
	}
}
