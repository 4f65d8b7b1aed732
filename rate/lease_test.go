package rate

import (
	"testing"
	"time"
)

func TestLeaseArithmetic(t *testing.T) {
	perSec := Limit{Algorithm: GCRA, Count: 100, Period: time.Second}
	hourly := Limit{Algorithm: Calendar, Count: 100, Unit: Hour, Location: time.UTC}
	const t0 = 1_000_000_000
	ms := int64(1000)
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		// LeaseDrained: 100/s drains one unit per 10ms, after the level under the lease.
		{"nothing drained at once", perSec.LeaseDrained(t0, 2, t0), 0},
		{"the level under the lease drains first", perSec.LeaseDrained(t0, 2, t0+20*ms), 0},
		{"then the leased units", perSec.LeaseDrained(t0, 2, t0+55*ms), 3.5},
		{"a clock behind the grant drains nothing", perSec.LeaseDrained(t0, 0, t0-ms), 0},
		{"a calendar quota does not drain", hourly.LeaseDrained(t0, 0, t0+time.Hour.Microseconds()), 0},
		// LeaseRefund: the undrained units, whole.
		{"all given back at once", float64(perSec.LeaseRefund(t0, 2, 9, t0)), 9},
		{"less what drained", float64(perSec.LeaseRefund(t0, 2, 9, t0+55*ms)), 5},
		{"nothing once drained", float64(perSec.LeaseRefund(t0, 2, 9, t0+time.Second.Microseconds())), 0},
		{"a calendar quota gives back every unit", float64(hourly.LeaseRefund(t0, 0, 9.5, t0+ms)), 9},
		// LeasePad: what 100/s drains in the hold, less the level already there.
		{"a fresh bucket is padded to the hold", float64(perSec.LeasePad(1, 100*ms)), 9},
		{"a full enough bucket is not", float64(perSec.LeasePad(15, 100*ms)), 0},
		{"padding is whole units", float64(perSec.LeasePad(1.5, 100*ms)), 9},
		{"a calendar quota needs none", float64(hourly.LeasePad(0, 100*ms)), 0},
		// LeaseExtra: a share of what remains, less the padding, in requests.
		{"a tenth of what remains", float64(perSec.LeaseExtra(99, 0, 1, 50, 0.1, 0.05)), 9},
		{"the padding counts", float64(perSec.LeaseExtra(99, 5, 1, 50, 0.1, 0.05)), 4},
		{"more padding than the share: none", float64(perSec.LeaseExtra(99, 20, 1, 50, 0.1, 0.05)), 0},
		{"in requests of the cost", float64(perSec.LeaseExtra(99, 0, 2, 50, 0.5, 0.05)), 24},
		{"no more than wanted", float64(perSec.LeaseExtra(99, 0, 1, 3, 0.1, 0.05)), 3},
		{"none near exhaustion", float64(perSec.LeaseExtra(4, 0, 1, 50, 1, 0.05)), 0},
		{"a bucket not charged sets no bound", float64(perSec.LeaseExtra(0, 0, 0, 50, 0.1, 0.05)), 50},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	for _, l := range []Limit{perSec, hourly} {
		if !l.Leasable() {
			t.Errorf("%s is not leasable", l.Algorithm)
		}
	}
	for _, a := range []Algorithm{Sliding, SlidingApprox} {
		if (Limit{Algorithm: a}).Leasable() {
			t.Errorf("%s is leasable", a)
		}
	}
}
