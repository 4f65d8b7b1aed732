package adaptive

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestConfigDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"interval", c.Interval, time.Second},
		{"floor", c.Floor, 0.1},
		{"cpu", c.CPU, Thresholds{Warn: 70, Critical: 85}},
		{"memory (off)", c.Memory, Thresholds{}},
		{"error_rate", c.ErrorRate, Thresholds{Warn: 1, Critical: 5}},
		{"latency", c.Latency, LatencyThresholds{Warn: 500 * time.Millisecond, Critical: 2 * time.Second}},
		{"latency_window", c.LatencyWindow, 30 * time.Second},
		{"min_requests", c.MinRequests, 100},
		{"smoothing", c.Smoothing, 2 * time.Second},
		{"hysteresis", c.Hysteresis, 0.1},
		{"backoff", c.Backoff, 0.5},
		{"recovery_delay", c.RecoveryDelay, 5 * time.Second},
		{"recovery_time", c.RecoveryTime, time.Minute},
		{"shared_max_age", c.SharedMaxAge, 3 * time.Second},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	if c.memoryEnabled() {
		t.Error("memory on by default")
	}
	// Setting one memory threshold turns memory on and defaults the other.
	m := Config{Memory: Thresholds{Critical: 95}}.WithDefaults()
	if !m.memoryEnabled() || m.Memory.Warn != 80 || m.Memory.Critical != 95 {
		t.Errorf("memory critical 95: %+v enabled %v", m.Memory, m.memoryEnabled())
	}
	// Partial thresholds keep what was set.
	p := Config{CPU: Thresholds{Warn: 50}, Interval: 500 * time.Millisecond}.WithDefaults()
	if p.CPU != (Thresholds{Warn: 50, Critical: 85}) || p.SharedMaxAge != 1500*time.Millisecond {
		t.Errorf("partial: cpu %+v shared_max_age %v", p.CPU, p.SharedMaxAge)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"zero value", Config{}, ""},
		{"everything set", Config{Interval: 2 * time.Second, Floor: 0.2, CPU: Thresholds{Warn: 60, Critical: 90}, Memory: Thresholds{Warn: 70, Critical: 80}, ErrorRate: Thresholds{Warn: 2, Critical: 10}, Latency: LatencyThresholds{Warn: time.Second, Critical: 3 * time.Second}, LatencyWindow: time.Minute, MinRequests: 10, Smoothing: time.Second, Hysteresis: 0.2, Backoff: 0.7, RecoveryDelay: 10 * time.Second, RecoveryTime: 5 * time.Minute, SharedMaxAge: 10 * time.Second}, ""},
		{"floor 1", Config{Floor: 1}, ""},
		{"disabled signals skip checks", Config{CPU: Thresholds{Warn: 99, Critical: 5, Disabled: true}, Latency: LatencyThresholds{Warn: -1, Disabled: true}}, ""},
		{"cpu warn above critical", Config{CPU: Thresholds{Warn: 90}}, "cpu: warn (90) must be below critical (85)"},
		{"cpu warn equals critical", Config{CPU: Thresholds{Warn: 80, Critical: 80}}, "cpu: warn (80) must be below critical (80)"},
		{"cpu over 100%", Config{CPU: Thresholds{Critical: 120}}, "cpu: critical (120) is a percentage"},
		{"negative cpu", Config{CPU: Thresholds{Warn: -5}}, "cpu: thresholds must be positive"},
		{"NaN cpu", Config{CPU: Thresholds{Warn: math.NaN()}}, "cpu: thresholds must be numbers"},
		{"memory inverted", Config{Memory: Thresholds{Warn: 95, Critical: 90}}, "memory: warn (95) must be below critical (90)"},
		{"error rate inverted", Config{ErrorRate: Thresholds{Warn: 6}}, "error_rate: warn (6) must be below critical (5)"},
		{"latency inverted", Config{Latency: LatencyThresholds{Warn: 3 * time.Second}}, "latency: warn (3s) must be below critical (2s)"},
		{"latency negative", Config{Latency: LatencyThresholds{Warn: -time.Second}}, "latency: thresholds must be positive"},
		{"floor zero is default, negative is not", Config{Floor: -0.1}, "floor -0.1 must be in (0, 1]"},
		{"floor above 1", Config{Floor: 1.5}, "floor 1.5 must be in (0, 1]"},
		{"floor NaN", Config{Floor: math.NaN()}, "floor NaN must be in (0, 1]"},
		{"backoff 1", Config{Backoff: 1}, "backoff 1 must be in (0, 1)"},
		{"hysteresis too large", Config{Hysteresis: 0.5}, "hysteresis 0.5 must be in [0, 0.5)"},
		{"interval too short", Config{Interval: time.Millisecond}, "interval 1ms is too short"},
		{"window shorter than interval", Config{Interval: 5 * time.Second, LatencyWindow: time.Second}, "latency_window 1s must be at least one interval (5s)"},
		{"negative min_requests", Config{MinRequests: -1}, "min_requests -1 must not be negative"},
		{"negative recovery", Config{RecoveryTime: -time.Second}, "recovery_time -1s must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("no error, want %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "adaptive: invalid config: ") {
				t.Errorf("error %q lacks context", err)
			}
			if _, nerr := New(tc.cfg, Options{CPU: SourceFunc(func(time.Time) (float64, error) { return 0, nil })}); (nerr != nil) != (err != nil) {
				t.Errorf("New disagrees with Validate: %v vs %v", nerr, err)
			}
		})
	}
	// All problems are reported at once.
	err := Config{Floor: 2, Backoff: 3}.Validate()
	if err == nil || !strings.Contains(err.Error(), "floor") || !strings.Contains(err.Error(), "backoff") {
		t.Errorf("want both problems, got %v", err)
	}
}

func TestConfigJSON(t *testing.T) {
	// The root embeds Config in its Caddy JSON: snake_case names, zero
	// fields omitted.
	b, err := json.Marshal(Config{})
	if err != nil || string(b) != "{}" {
		t.Errorf("zero config marshals to %s, %v; want {}", b, err)
	}
	in := `{"interval":2000000000,"floor":0.2,"cpu":{"warn":60,"critical":80},"memory":{"warn":75},` +
		`"error_rate":{"disabled":true},"latency":{"warn":1000000000,"critical":4000000000},"latency_window":60000000000,` +
		`"min_requests":20,"smoothing":1000000000,"hysteresis":0.05,"backoff":0.6,"recovery_delay":3000000000,` +
		`"recovery_time":120000000000,"shared_max_age":9000000000}`
	var c Config
	dec := json.NewDecoder(strings.NewReader(in))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		t.Fatal(err)
	}
	want := Config{Interval: 2 * time.Second, Floor: 0.2, CPU: Thresholds{Warn: 60, Critical: 80}, Memory: Thresholds{Warn: 75},
		ErrorRate: Thresholds{Disabled: true}, Latency: LatencyThresholds{Warn: time.Second, Critical: 4 * time.Second},
		LatencyWindow: time.Minute, MinRequests: 20, Smoothing: time.Second, Hysteresis: 0.05, Backoff: 0.6,
		RecoveryDelay: 3 * time.Second, RecoveryTime: 2 * time.Minute, SharedMaxAge: 9 * time.Second}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("decoded %+v\nwant    %+v", c, want)
	}
	out, _ := json.Marshal(c)
	if string(out) != in {
		t.Errorf("round trip:\n%s\nwant\n%s", out, in)
	}
}

func TestPriorityText(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Priority
		bad  bool
	}{
		{"", PriorityInteractive, false},
		{"interactive", PriorityInteractive, false},
		{"batch", PriorityBatch, false},
		{"critical", PriorityCritical, false},
		{"Batch", 0, true},
		{"bulk", 0, true},
	} {
		var p Priority
		err := json.Unmarshal([]byte(`"`+tc.in+`"`), &p)
		if (err != nil) != tc.bad || (!tc.bad && p != tc.want) {
			t.Errorf("%q: %v, %v; want %v (error %v)", tc.in, p, err, tc.want, tc.bad)
		}
		if !tc.bad && tc.in != "" {
			if b, _ := json.Marshal(p); string(b) != `"`+tc.in+`"` {
				t.Errorf("%v marshals to %s", p, b)
			}
		}
	}
	if _, err := json.Marshal(Priority(9)); err == nil {
		t.Error("invalid priority marshalled")
	}
	if LevelFloor.String() != "floor" || Level(9).String() != "Level(9)" {
		t.Error("level names")
	}
}
