package simulate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// errNotAccess marks a JSON line of a Caddy log that is not an access log
// entry (another logger's line): skipped, not malformed.
var errNotAccess = errors.New("not an access log entry")

// caddyEntry is the part of a Caddy access log entry the simulation reads
// (modules/caddyhttp/server.go's logRequest and LoggableHTTPRequest).
type caddyEntry struct {
	TS      flexTime `json:"ts"`
	Request *struct {
		RemoteIP   string      `json:"remote_ip"`
		RemotePort string      `json:"remote_port"`
		ClientIP   string      `json:"client_ip"`
		Proto      string      `json:"proto"`
		Method     string      `json:"method"`
		Host       string      `json:"host"`
		URI        string      `json:"uri"`
		Headers    http.Header `json:"headers"` // Caddy writes arrays: decoded in one pass
		TLS        *struct{}   `json:"tls"`
	} `json:"request"`
	BytesRead   *int64       `json:"bytes_read"`
	Duration    flexDuration `json:"duration"`
	Size        int64        `json:"size"`
	Status      int          `json:"status"`
	RespHeaders http.Header  `json:"resp_headers"`
}

// jsonlEntry is the documented JSONL form (docs/rollout.md): one request a
// line, Time when it arrived.
type jsonlEntry struct {
	Time       flexTime     `json:"time"`
	Method     string       `json:"method"`
	Host       string       `json:"host"`
	URI        string       `json:"uri"`
	Proto      string       `json:"proto"`
	RemoteIP   string       `json:"remote_ip"`
	RemotePort string       `json:"remote_port"`
	ClientIP   string       `json:"client_ip"`
	TLS        bool         `json:"tls"`
	Headers    flexHeader   `json:"headers"`
	Status     int          `json:"status"`
	Size       int64        `json:"size"`
	BytesRead  *int64       `json:"bytes_read"`
	Duration   flexDuration `json:"duration"`
}

// jsonError says why a line did not decode: it is not JSON, or a field of
// it is not what the format says.
func jsonError(err error) error {
	if _, ok := errors.AsType[*json.SyntaxError](err); ok {
		return fmt.Errorf("not JSON: %w", err)
	}
	return fmt.Errorf("a field is not what the format says: %w", err)
}

// parseCaddy reads one line of Caddy's JSON access log into r.
func parseCaddy(line []byte, r *Request) error {
	var e caddyEntry
	if err := json.Unmarshal(line, &e); err != nil {
		return jsonError(err)
	}
	if e.Request == nil {
		return errNotAccess
	}
	if e.TS.IsZero() {
		return errors.New("no ts")
	}
	q := e.Request
	if q.Method == "" || q.URI == "" {
		return errors.New("no request method or uri")
	}
	*r = Request{
		Time: e.TS.Time.Add(-time.Duration(e.Duration)), Method: q.Method, Host: q.Host, URI: q.URI, Proto: q.Proto,
		RemoteIP: q.RemoteIP, RemotePort: q.RemotePort, ClientIP: q.ClientIP, TLS: q.TLS != nil,
		Header: canonical(q.Headers), Status: e.Status, Size: e.Size, RespHeader: canonical(e.RespHeaders),
		BytesRead: -1, Duration: time.Duration(e.Duration),
	}
	if e.BytesRead != nil {
		r.BytesRead = *e.BytesRead
	}
	return nil
}

// parseJSONL reads one line of the JSONL form into r.
func parseJSONL(line []byte, r *Request) error {
	var e jsonlEntry
	if err := json.Unmarshal(line, &e); err != nil {
		return jsonError(err)
	}
	if e.Time.IsZero() {
		return errors.New("no time")
	}
	if e.Method == "" || e.URI == "" {
		return errors.New("no method or uri")
	}
	*r = Request{
		Time: e.Time.Time, Method: e.Method, Host: e.Host, URI: e.URI, Proto: e.Proto,
		RemoteIP: e.RemoteIP, RemotePort: e.RemotePort, ClientIP: e.ClientIP, TLS: e.TLS,
		Header: http.Header(e.Headers), Status: e.Status, Size: e.Size, BytesRead: -1, Duration: time.Duration(e.Duration),
	}
	if e.BytesRead != nil {
		r.BytesRead = *e.BytesRead
	}
	return nil
}

// clfTime is the Common Log Format's timestamp.
const clfTime = "02/Jan/2006:15:04:05 -0700"

// parseCombined reads one line of the Common or Combined Log Format:
//
//	host ident user [time] "request" status bytes ["referer" "user agent"]
//
// Fields after the user agent (nginx's additions) are ignored.
func parseCombined(line []byte, r *Request) error {
	s := string(bytes.TrimSpace(line))
	field := func() string {
		i := strings.IndexByte(s, ' ')
		if i < 0 {
			f := s
			s = ""
			return f
		}
		f := s[:i]
		s = strings.TrimLeft(s[i+1:], " ")
		return f
	}
	host, _, user := field(), field(), field()
	if host == "" || !strings.HasPrefix(s, "[") {
		return errors.New("no [time] after host, ident and user")
	}
	end := strings.IndexByte(s, ']')
	if end < 0 {
		return errors.New("no ] closing the time")
	}
	t, err := time.Parse(clfTime, s[1:end])
	if err != nil {
		return fmt.Errorf("time %q: want %s", s[1:end], clfTime)
	}
	s = strings.TrimLeft(s[end+1:], " ")
	reqLine, rest, err := quoted(s)
	if err != nil {
		return fmt.Errorf("request line: %w", err)
	}
	s = strings.TrimLeft(rest, " ")
	method, rl, _ := strings.Cut(reqLine, " ")
	uri, proto, _ := strings.Cut(rl, " ")
	if method == "" || uri == "" {
		return fmt.Errorf("request line %q: want \"METHOD URI PROTO\"", reqLine)
	}
	status, err := strconv.Atoi(field())
	if err != nil {
		return errors.New("status is not a number")
	}
	size := int64(0)
	if b := field(); b != "-" {
		if size, err = strconv.ParseInt(b, 10, 64); err != nil {
			return errors.New("size is neither a number nor -")
		}
	}
	*r = Request{Time: t, Method: method, URI: uri, Proto: proto, RemoteIP: host, Status: status, Size: size, BytesRead: -1, Header: http.Header{}}
	if user != "-" {
		r.Header.Set("X-Clf-User", user) // not a header: the log's authenticated user, for keys that want it
	}
	for _, name := range []string{"Referer", "User-Agent"} {
		if !strings.HasPrefix(s, "\"") {
			break
		}
		v, rest, err := quoted(s)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if v != "-" && v != "" {
			r.Header.Set(name, v)
		}
		s = strings.TrimLeft(rest, " ")
	}
	return nil
}

// quoted reads a double-quoted field at the start of s and returns it
// and what follows. Backslash escapes are undone as Apache and nginx
// write them: \" and \\ (Apache), \xHH (both; nginx writes " as \x22),
// \n, \r, \t; another backslash stands for itself.
func quoted(s string) (string, string, error) {
	if !strings.HasPrefix(s, "\"") {
		return "", s, errors.New("not quoted")
	}
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			if i+1 >= len(s) {
				b.WriteByte(c)
				continue
			}
			switch e := s[i+1]; e {
			case '"', '\\':
				b.WriteByte(e)
				i++
			case 'n', 'r', 't':
				b.WriteByte("\n\r\t"[strings.IndexByte("nrt", e)])
				i++
			case 'x':
				if v, err := strconv.ParseUint(s[i+2:min(i+4, len(s))], 16, 8); err == nil && i+4 <= len(s) {
					b.WriteByte(byte(v))
					i += 3
				} else {
					b.WriteByte(c)
				}
			default:
				b.WriteByte(c)
			}
		case '"':
			return b.String(), s[i+1:], nil
		default:
			b.WriteByte(c)
		}
	}
	return "", "", errors.New("no closing quote")
}

// flexTime is a timestamp as a number of seconds since the Unix epoch
// (Caddy's default) or an RFC 3339 string (its time_format iso8601 or
// rfc3339, and the JSONL form).
type flexTime struct{ time.Time }

func (t *flexTime) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.000Z0700"} {
			if v, err := time.Parse(layout, s); err == nil {
				t.Time = v
				return nil
			}
		}
		return fmt.Errorf("time %q: give seconds since the Unix epoch or RFC 3339", s)
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f <= 0 || math.IsInf(f, 0) || f > 1<<40 {
		return fmt.Errorf("time %s: give seconds since the Unix epoch or RFC 3339", b)
	}
	sec, frac := math.Modf(f)
	// Rounded to the µs: a float64 of today's seconds holds no finer.
	t.Time = time.Unix(int64(sec), int64(math.Round(frac*1e6))*1e3).UTC()
	return nil
}

// flexDuration is a duration as seconds (Caddy's default) or a Go
// duration string (its duration_format string).
type flexDuration time.Duration

func (d *flexDuration) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		v, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		if v < 0 {
			return fmt.Errorf("duration %q: negative", s)
		}
		*d = flexDuration(v)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f < 0 || f > 1e9 {
		return fmt.Errorf("duration %s: give seconds", b)
	}
	*d = flexDuration(time.Duration(math.Round(f * 1e9)))
	return nil
}

// flexHeader is a header whose values are arrays (Caddy's) or single
// strings (the JSONL form allows both).
type flexHeader http.Header

func (h *flexHeader) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	// Names that differ in case only are one field, their values in the
	// order of the names as written (byte order): the same every time.
	names := make([]string, 0, len(raw))
	for k := range raw {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make(flexHeader, len(raw))
	for _, name := range names {
		k, v := http.CanonicalHeaderKey(name), raw[name]
		if len(v) > 0 && v[0] == '"' {
			var s string
			if err := json.Unmarshal(v, &s); err != nil {
				return err
			}
			out[k] = append(out[k], s)
			continue
		}
		var vs []string
		if err := json.Unmarshal(v, &vs); err != nil {
			return fmt.Errorf("header %q: want a string or an array of strings", k)
		}
		out[k] = append(out[k], vs...)
	}
	*h = out
	return nil
}

// canonical returns h with its names in canonical form (Caddy's are
// already: then h itself).
func canonical(h http.Header) http.Header {
	for k, v := range h {
		if ck := http.CanonicalHeaderKey(k); ck != k {
			delete(h, k)
			h[ck] = append(h[ck], v...)
		}
	}
	return h
}

// detect tells the format of a file from its first line.
func detect(line []byte) Format {
	line = bytes.TrimSpace(line)
	if len(line) == 0 || line[0] != '{' {
		return Combined
	}
	// By the names at the top of the object, not anywhere in the line (a
	// logged header may be named ts).
	var top map[string]json.RawMessage
	if json.Unmarshal(line, &top) != nil { // cut short (a rotated file's first line): by what it holds
		if bytes.Contains(line, []byte(`"request":{`)) || bytes.Contains(line, []byte(`"ts":`)) {
			return Caddy
		}
		return JSONL
	}
	_, request := top["request"]
	_, ts := top["ts"]
	_, at := top["time"]
	if request || ts && !at {
		return Caddy
	}
	return JSONL
}

// parserOf returns the line parser of format f.
func parserOf(f Format) func([]byte, *Request) error {
	switch f {
	case Caddy:
		return parseCaddy
	case JSONL:
		return parseJSONL
	}
	return parseCombined
}
