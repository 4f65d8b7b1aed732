package adaptive

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// A Probe reads the current value of a remote signal (Prometheus or HTTP).
// The controller calls it from the signal's own goroutine, once per
// SignalConfig.Interval, with a context that ends after the signal's
// Timeout or when the controller stops. A Probe is never called
// concurrently with itself.
type Probe interface {
	Probe(ctx context.Context) (float64, error)
}

// ProbeFunc adapts a function to Probe.
type ProbeFunc func(ctx context.Context) (float64, error)

// Probe calls f.
func (f ProbeFunc) Probe(ctx context.Context) (float64, error) { return f(ctx) }

// maxBody bounds what a probe reads of a response: an exporter's page is a
// few hundred kilobytes at most, a health document far less.
const maxBody = 16 << 20

// fetch GETs url and returns its body, failing on a status other than 2xx
// or a body larger than maxBody.
func fetch(ctx context.Context, client *http.Client, url, shown, accept string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("GET %s: not a URL a request can be made to", shown)
	}
	req.Header.Set("Accept", accept)
	resp, err := client.Do(req)
	if err != nil {
		var ue *neturl.Error
		if errors.As(err, &ue) {
			err = ue.Err // it names the URL, credentials and all
		}
		return nil, fmt.Errorf("GET %s: %w", shown, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10)) // let the connection be reused
		return nil, fmt.Errorf("GET %s: status %s", shown, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: reading the body: %w", shown, err)
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("GET %s: body larger than %d bytes", shown, maxBody)
	}
	return body, nil
}

// shownURL is how errors and logs name a signal's URL: without its
// password and its query, where credentials go when no header can.
func shownURL(raw string) string {
	u, err := neturl.Parse(raw)
	if err != nil {
		return "(a URL that cannot be parsed)"
	}
	u.RawQuery, u.Fragment = "", ""
	if u.User != nil {
		u.User = neturl.User(u.User.Username())
	}
	return u.String()
}

// prometheusProbe reads one series, or the ratio of two, from a Prometheus
// text exposition.
type prometheusProbe struct {
	client   *http.Client
	url      string
	shown    string    // url as errors name it (shownURL)
	num, den *selector // den nil: no ratio
}

func newPrometheusProbe(client *http.Client, p *PrometheusSignal) (*prometheusProbe, error) {
	num, err := parseSelector(p.Metric)
	if err != nil {
		return nil, fmt.Errorf("metric: %w", err)
	}
	probe := &prometheusProbe{client: client, url: p.URL, shown: shownURL(p.URL), num: num}
	if p.DivideBy != "" {
		if probe.den, err = parseSelector(p.DivideBy); err != nil {
			return nil, fmt.Errorf("divide_by: %w", err)
		}
	}
	return probe, nil
}

// Probe fetches the exposition and evaluates the selectors.
func (p *prometheusProbe) Probe(ctx context.Context) (float64, error) {
	body, err := fetch(ctx, p.client, p.url, p.shown, string(expfmt.NewFormat(expfmt.TypeTextPlain)))
	if err != nil {
		return 0, err
	}
	return p.eval(body)
}

// eval parses an exposition and evaluates the selectors in it.
func (p *prometheusProbe) eval(body []byte) (float64, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		return 0, fmt.Errorf("%s: parsing the exposition: %w", p.shown, err)
	}
	v, err := p.num.value(families)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.shown, err)
	}
	if p.den == nil {
		return v, nil
	}
	d, err := p.den.value(families)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", p.shown, err)
	}
	if !(d > 0) {
		return 0, fmt.Errorf("%s: %s is %v: a ratio needs a positive divisor", p.shown, p.den, d)
	}
	return v / d, nil
}

// selector picks one series of a metric family by exact label values.
type selector struct {
	name   string
	labels [][2]string // name, value
}

// String writes the selector as it is configured.
func (s *selector) String() string {
	if len(s.labels) == 0 {
		return s.name
	}
	var b strings.Builder
	b.WriteString(s.name)
	b.WriteByte('{')
	for i, l := range s.labels {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%q", l[0], l[1])
	}
	b.WriteByte('}')
	return b.String()
}

// value returns the value of the one series s matches in families.
func (s *selector) value(families map[string]*dto.MetricFamily) (float64, error) {
	mf := families[s.name]
	if mf == nil {
		return 0, fmt.Errorf("metric %s not found", s.name)
	}
	switch mf.GetType() {
	case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
	default:
		// A counter only grows: read as a level it would end critical
		// for good.
		return 0, fmt.Errorf("metric %s is a %s: select a gauge (a level, not a running total)", s.name, strings.ToLower(mf.GetType().String()))
	}
	var found *dto.Metric
	n := 0
	for _, m := range mf.GetMetric() {
		if s.matches(m) {
			found = m
			n++
		}
	}
	switch {
	case n == 0:
		return 0, fmt.Errorf("no series of %s matches %s", s.name, s)
	case n > 1:
		return 0, fmt.Errorf("%s matches %d series of %s: add labels to select one", s, n, s.name)
	}
	var v float64
	switch {
	case found.Gauge != nil:
		v = found.Gauge.GetValue()
	case found.Counter != nil:
		v = found.Counter.GetValue()
	default:
		v = found.GetUntyped().GetValue()
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("%s is %v", s, v)
	}
	return v, nil
}

// matches reports whether m has every label of s with its value; a label
// that m lacks has the empty value, as in PromQL.
func (s *selector) matches(m *dto.Metric) bool {
	for _, want := range s.labels {
		got := ""
		for _, lp := range m.GetLabel() {
			if lp.GetName() == want[0] {
				got = lp.GetValue()
				break
			}
		}
		if got != want[1] {
			return false
		}
	}
	return true
}

// parseSelector parses `name` or `name{label="value",...}` (PromQL's instant
// vector selector with equality matchers only; bare values allowed).
func parseSelector(src string) (*selector, error) {
	s := strings.TrimSpace(src)
	if s == "" {
		return nil, errors.New(`empty selector: want a metric name, such as pg_pool_in_use or pg_pool_in_use{pool="main"}`)
	}
	name, rest, braces := strings.Cut(s, "{")
	name = strings.TrimSpace(name)
	if !model.LegacyValidation.IsValidMetricName(name) {
		return nil, fmt.Errorf("%q: %q is not a metric name", src, name)
	}
	sel := &selector{name: name}
	if !braces {
		return sel, nil
	}
	rest, ok := strings.CutSuffix(strings.TrimSpace(rest), "}")
	if !ok {
		return nil, fmt.Errorf("%q: missing the closing '}'", src)
	}
	for {
		rest = strings.TrimLeft(rest, " \t")
		if rest == "" {
			return sel, nil
		}
		i := strings.IndexAny(rest, "=!~")
		if i <= 0 {
			return nil, fmt.Errorf("%q: want label=\"value\" at %q", src, rest)
		}
		label := strings.TrimSpace(rest[:i])
		if !model.LegacyValidation.IsValidLabelName(label) {
			return nil, fmt.Errorf("%q: %q is not a label name", src, label)
		}
		rest = rest[i:]
		if strings.HasPrefix(rest, "!=") || strings.HasPrefix(rest, "=~") || strings.HasPrefix(rest, "!~") {
			return nil, fmt.Errorf("%q: only equality matchers (label=\"value\") are supported, not %s", src, rest[:2])
		}
		rest = strings.TrimLeft(rest[1:], " \t")
		var value string
		if strings.HasPrefix(rest, `"`) {
			end := 1
			for end < len(rest) && rest[end] != '"' {
				if rest[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(rest) {
				return nil, fmt.Errorf("%q: unterminated quoted value", src)
			}
			v, err := strconv.Unquote(rest[:end+1])
			if err != nil {
				return nil, fmt.Errorf("%q: value %s: %w", src, rest[:end+1], err)
			}
			value, rest = v, rest[end+1:]
		} else {
			end := strings.IndexFunc(rest, func(r rune) bool {
				return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.:", r))
			})
			if end < 0 {
				end = len(rest)
			}
			if end == 0 {
				return nil, fmt.Errorf("%q: missing the value of label %s (quote it if it has other characters)", src, label)
			}
			value, rest = rest[:end], rest[end:]
		}
		sel.labels = append(sel.labels, [2]string{label, value})
		rest = strings.TrimLeft(rest, " \t")
		if rest != "" {
			var comma bool
			if rest, comma = strings.CutPrefix(rest, ","); !comma {
				return nil, fmt.Errorf("%q: want ',' or '}' after %s=%q", src, label, value)
			}
		}
	}
}

// httpProbe reads a number at a dotted path of a JSON document.
type httpProbe struct {
	client *http.Client
	url    string
	shown  string // url as errors name it (shownURL)
	field  string
	path   []string
}

func newHTTPProbe(client *http.Client, h *HTTPSignal) (*httpProbe, error) {
	path, err := parseField(h.Field)
	if err != nil {
		return nil, fmt.Errorf("field: %w", err)
	}
	return &httpProbe{client: client, url: h.URL, shown: shownURL(h.URL), field: h.Field, path: path}, nil
}

// parseField splits a dotted path.
func parseField(field string) ([]string, error) {
	if field == "" {
		return nil, errors.New(`empty: want the number's dotted path in the JSON, such as db.pool.in_use`)
	}
	path := strings.Split(field, ".")
	for _, p := range path {
		if p == "" {
			return nil, fmt.Errorf("%q has an empty segment", field)
		}
	}
	return path, nil
}

// Probe fetches the document and reads the field.
func (p *httpProbe) Probe(ctx context.Context) (float64, error) {
	body, err := fetch(ctx, p.client, p.url, p.shown, "application/json")
	if err != nil {
		return 0, err
	}
	return p.eval(body)
}

// eval reads the field from a JSON document.
func (p *httpProbe) eval(body []byte) (float64, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, fmt.Errorf("%s: not JSON: %w", p.shown, err)
	}
	for i, key := range p.path {
		switch node := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = node[key]; !ok {
				return 0, fmt.Errorf("%s: no field %s", p.shown, strings.Join(p.path[:i+1], "."))
			}
		case []any:
			n, err := strconv.Atoi(key)
			if err != nil || n < 0 || n >= len(node) {
				return 0, fmt.Errorf("%s: %s is an array of %d: %q is not an index in it", p.shown, strings.Join(p.path[:i], "."), len(node), key)
			}
			v = node[n]
		default:
			where := strings.Join(p.path[:i], ".")
			if i == 0 {
				where = "the document"
			}
			return 0, fmt.Errorf("%s: %s is not an object", p.shown, where)
		}
	}
	num, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%s: %s is %s, not a number", p.shown, p.field, jsonKind(v))
	}
	f, err := num.Float64()
	if err != nil {
		return 0, fmt.Errorf("%s: %s: %w", p.shown, p.field, err)
	}
	return f, nil
}

func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("the string %q", v)
	case bool:
		return strconv.FormatBool(v)
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	return fmt.Sprintf("%T", v)
}
