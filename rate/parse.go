package rate

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParsePer reads the period of a rate such as the "h" of "1000/h". It accepts
// unit words (s, sec, second, m, min, minute, h, hour, d, day, w, week, and
// their plurals), a Go duration with a day suffix allowed ("30m", "15s",
// "1h30m", "2d"), and "month", which has no fixed length and so is returned
// as a calendar Unit with a zero duration.
func ParsePer(s string) (time.Duration, Unit, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "s", "sec", "secs", "second", "seconds":
		return time.Second, "", nil
	case "m", "min", "mins", "minute", "minutes":
		return time.Minute, "", nil
	case "h", "hr", "hrs", "hour", "hours":
		return time.Hour, "", nil
	case "d", "day", "days":
		return 24 * time.Hour, "", nil
	case "w", "wk", "week", "weeks":
		return 7 * 24 * time.Hour, "", nil
	case "mo", "month", "months":
		return 0, Month, nil
	}
	d, err := parseDuration(s)
	if err != nil {
		return 0, "", fmt.Errorf("unknown period %q: use s, min, h, day, week, month or a duration such as 30m", s)
	}
	if d <= 0 {
		return 0, "", fmt.Errorf("period %q must be positive", s)
	}
	return d, "", nil
}

// parseDuration is time.ParseDuration plus a "d" (24h) suffix, like
// caddy.ParseDuration, without importing Caddy into this package.
func parseDuration(s string) (time.Duration, error) {
	if i := strings.Index(s, "d"); i > 0 {
		days, err := strconv.ParseFloat(s[:i], 64)
		if err != nil {
			return 0, err
		}
		rest := time.Duration(0)
		if i+1 < len(s) {
			if rest, err = time.ParseDuration(s[i+1:]); err != nil {
				return 0, err
			}
		}
		return time.Duration(days*float64(24*time.Hour)) + rest, nil
	}
	return time.ParseDuration(s)
}

// CalendarUnit maps a fixed period to the calendar unit of the same name, for
// "1000/day calendar": an hour, a day or a week.
func CalendarUnit(d time.Duration) (Unit, bool) {
	switch d {
	case time.Hour:
		return Hour, true
	case 24 * time.Hour:
		return Day, true
	case 7 * 24 * time.Hour:
		return Week, true
	}
	return "", false
}
