package rls

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/caddy-cascade/cascade/rate"
)

// Rules are envoyproxy/ratelimit's configuration: domains, each a tree of
// descriptor rules, read from its YAML files as they are (see LoadRules).
// They are read only once loaded.
type Rules struct {
	domains map[string]*ruleLevel
	files   []string
	count   int               // rules with a rate_limit
	sum     [sha256.Size]byte // of the files' names and contents
}

// ruleLevel is the rules under one parent (a domain, or a rule): by
// "key_value", or "key" for a rule without a value, as envoyproxy/ratelimit
// keys them, and the keys of its wildcard rules ("key_prefix*") in the
// order of the file.
type ruleLevel struct {
	rules     map[string]*rule
	wildcards []string
}

// rule is one descriptor of the configuration.
type rule struct {
	ruleLevel
	// path is the rule's place, domain.key_value.key…: its name in metrics
	// (envoyproxy/ratelimit's FullKey) and errors.
	path  string
	limit *ruleLimit // nil: none at this level
	// valueToMetric puts a request's value, rather than the wildcard or
	// nothing, in the metric name of a descriptor that this rule matches.
	valueToMetric bool
	// shareThreshold makes every value this wildcard matches count in one
	// bucket, the pattern's.
	shareThreshold bool
}

// ruleLimit is a rule's rate_limit.
type ruleLimit struct {
	path           string // the rule's path
	requests       uint32
	unit           rlsv3.RateLimitResponse_RateLimit_Unit
	window         time.Duration
	unlimited      bool
	shadow         bool // shadow_mode: over the limit is answered OK, and counted
	quota          bool // quota_mode: as shadow_mode, counted apart
	name           string
	replaces       []string
	detailedMetric bool
	rate           rate.Limit // a Fixed window of window, when requests > 0
}

// Files are the files the rules were read from.
func (r *Rules) Files() []string { return r.files }

// Domains are the domains of the rules, sorted.
func (r *Rules) Domains() []string {
	names := make([]string, 0, len(r.domains))
	for d := range r.domains {
		names = append(names, d)
	}
	slices.Sort(names)
	return names
}

// Len is the number of rules with a rate_limit.
func (r *Rules) Len() int { return r.count }

// unitWindows are the windows of envoyproxy/ratelimit's units, as it
// divides time (utils.UnitToDivider): a month is 30 days, a year 365.
var unitWindows = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// fixedLimit is a limit of n per window, counted in windows aligned to
// the Unix epoch as envoyproxy/ratelimit counts them.
func fixedLimit(n uint32, window time.Duration) rate.Limit {
	return rate.Limit{Algorithm: rate.Calendar, Unit: rate.Fixed, Count: int64(n), Period: window}
}

// LoadRules reads envoyproxy/ratelimit's YAML configuration from paths,
// each a file or a directory whose *.yaml and *.yml files, its
// subdirectories' too (not those starting with a dot), are read in name
// order; any other file there is an error (envoyproxy/ratelimit would
// read it as rules). Each file is one domain. Every error is reported, each naming its file and
// line: an unknown or misplaced field, a wrong type, a bad unit, a
// duplicate descriptor or domain.
func LoadRules(paths ...string) (*Rules, error) {
	files, contents, err := readRuleFiles(paths)
	if err != nil {
		return nil, err
	}
	r := &Rules{domains: map[string]*ruleLevel{}, files: files}
	from := map[string]string{} // domain → the file that has it
	var errs []error
	for i, f := range files {
		errs = append(errs, r.parse(f, contents[i], from)...)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	r.sum = sumOf(files, contents)
	return r, nil
}

// Changed says whether the files of paths are not those r was read from:
// other files, or other contents (a file rewritten, or replaced by a
// symbolic link's swap, as Kubernetes updates a ConfigMap's).
func (r *Rules) Changed(paths ...string) (bool, error) {
	files, contents, err := readRuleFiles(paths)
	if err != nil {
		return false, err
	}
	return sumOf(files, contents) != r.sum, nil
}

// sumOf is a digest of files' names and contents.
func sumOf(files []string, contents [][]byte) [sha256.Size]byte {
	h := sha256.New()
	for i, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f), f, len(contents[i]))
		h.Write(contents[i])
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// readRuleFiles lists the files of paths as LoadRules reads them, and
// reads them.
func readRuleFiles(paths []string) (files []string, contents [][]byte, _ error) {
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, nil, fmt.Errorf("rls config: %w", err)
		}
		if !fi.IsDir() {
			files = append(files, p)
			continue
		}
		// Every file under it, as envoyproxy/ratelimit reads its runtime
		// directory (its subdirectories too, dotfiles and dot directories
		// not: Kubernetes' ..data of a ConfigMap): a file it would read
		// that Cascade does not is an error, not rules silently not served.
		n := len(files)
		var others []string
		err = filepath.WalkDir(p, func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch name := e.Name(); {
			case path == p:
			case strings.HasPrefix(name, ".") && e.IsDir():
				return filepath.SkipDir
			case strings.HasPrefix(name, ".") || e.IsDir():
			case strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml"):
				files = append(files, path)
			default:
				others = append(others, path)
			}
			return nil
		})
		if err != nil {
			return nil, nil, fmt.Errorf("rls config: %w", err)
		}
		if len(others) > 0 {
			return nil, nil, fmt.Errorf("rls config: directory %s holds files that are neither .yaml nor .yml, which envoyproxy/ratelimit would read as configuration: rename them, or move them out: %s",
				p, strings.Join(others[:min(len(others), 10)], ", "))
		}
		if len(files) == n {
			return nil, nil, fmt.Errorf("rls config: directory %s has no .yaml or .yml file", p)
		}
	}
	for _, f := range files {
		data, err := readRuleFile(f)
		if err != nil {
			return nil, nil, fmt.Errorf("rls config: %w", err)
		}
		contents = append(contents, data)
	}
	return files, contents, nil
}

// maxRuleFile bounds the size of one file of rules.
const maxRuleFile = 16 << 20

// readRuleFile reads f, a regular file (or a link to one) of at most
// maxRuleFile bytes: not a named pipe, which would block the reader (the
// watcher, or Caddy's load) forever, nor a device that never ends.
func readRuleFile(f string) ([]byte, error) {
	fi, err := os.Stat(f) // before opening: opening a named pipe blocks
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v)", f, fi.Mode().Type())
	}
	fd, err := os.Open(f)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	data, err := io.ReadAll(io.LimitReader(fd, maxRuleFile+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxRuleFile {
		return nil, fmt.Errorf("%s is larger than %d MiB", f, maxRuleFile>>20)
	}
	return data, nil
}

// ParseRules reads one file's content, named file in errors: for tests
// and for checking a file before it is deployed.
func ParseRules(file string, data []byte) (*Rules, error) {
	r := &Rules{domains: map[string]*ruleLevel{}, files: []string{file}}
	if err := errors.Join(r.parse(file, data, map[string]string{})...); err != nil {
		return nil, err
	}
	return r, nil
}

// parser reads one file.
type parser struct {
	file  string
	errs  []error
	rules *Rules
	// nodes counts the nodes read, anchors' once for each alias: a file of
	// aliases of aliases (a "billion laughs") stops at budget.
	nodes, budget int
}

// maxRuleNodes bounds the YAML nodes one file is read as, once its
// aliases are expanded, unless the file itself has more than a quarter
// of that (a file of many rules reads each of its nodes about twice):
// far beyond any real configuration's aliases.
var maxRuleNodes = 1 << 20 // a variable for tests

// countNodes is the number of nodes of n, an alias one node.
func countNodes(n *yaml.Node) int {
	count := 0
	stack := []*yaml.Node{n}
	for len(stack) > 0 {
		n, stack = stack[len(stack)-1], stack[:len(stack)-1]
		count++
		if n.Kind != yaml.AliasNode {
			stack = append(stack, n.Content...)
		}
	}
	return count
}

// resolve is n, or the node its alias names; false (with an error, once)
// when the file has expanded to more than maxRuleNodes.
func (p *parser) resolve(n *yaml.Node) (*yaml.Node, bool) {
	for depth := 0; n.Kind == yaml.AliasNode && n.Alias != nil && depth < 100; depth++ {
		n = n.Alias
	}
	p.nodes++
	if p.nodes == p.budget+1 {
		p.errorf(n, "more than %d nodes once its aliases are expanded", p.budget)
	}
	return n, p.nodes <= p.budget
}

func (p *parser) errorf(n *yaml.Node, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s", p.file, n.Line, fmt.Sprintf(format, args...)))
}

// The fields of each mapping, as envoyproxy/ratelimit names them.
var (
	topFields        = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold"}
	rateLimitFields  = []string{"requests_per_unit", "unit", "unlimited", "name", "replaces"}
	replacesFields   = []string{"name"}
)

// fields walks mapping n, calling each for every field with its value
// node; a field not in known is an error naming the line, the place and
// the fields expected, as is a field given twice.
//
// Aliases are followed, and merge keys (<<: *anchor) merged as
// envoyproxy/ratelimit's YAML library merges them: a field of the mapping
// itself wins over a merged one, and of several merged mappings, the first.
func (p *parser) fields(n *yaml.Node, where string, known []string, each func(key string, v *yaml.Node)) {
	n, ok := p.resolve(n)
	if !ok {
		return
	}
	if n.Kind != yaml.MappingNode {
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return
		}
		p.errorf(n, "%s must be a mapping of %s", where, strings.Join(known, ", "))
		return
	}
	pairs, ok := p.merged(n, 0)
	if !ok {
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(pairs); i += 2 {
		k, v := pairs[i], pairs[i+1]
		if v, ok = p.resolve(v); !ok {
			return
		}
		if !slices.Contains(known, k.Value) {
			p.errorf(k, "unknown field %q in %s: expected %s", k.Value, where, strings.Join(known, ", "))
			continue
		}
		if seen[k.Value] {
			p.errorf(k, "%q given twice in %s", k.Value, where)
			continue
		}
		seen[k.Value] = true
		each(k.Value, v)
	}
}

// merged are the keys and values of mapping n with its merge keys'
// mappings merged in: n's own fields first, then each merged field n
// does not have, the first merged mapping's first.
func (p *parser) merged(n *yaml.Node, depth int) ([]*yaml.Node, bool) {
	var own, merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.Tag == "!!merge" {
			merges = append(merges, v)
			continue
		}
		own = append(own, k, v)
	}
	if len(merges) == 0 {
		return own, true
	}
	if depth > 100 {
		p.errorf(n, "merge keys (<<) nested more than 100 deep")
		return nil, false
	}
	has := map[string]bool{}
	for i := 0; i < len(own); i += 2 {
		has[own[i].Value] = true
	}
	out := own
	add := func(m *yaml.Node) bool {
		m, ok := p.resolve(m)
		if !ok {
			return false
		}
		if m.Kind != yaml.MappingNode {
			p.errorf(m, "a merge key (<<) must name a mapping, or a list of them")
			return true
		}
		pairs, ok := p.merged(m, depth+1)
		if !ok {
			return false
		}
		for i := 0; i+1 < len(pairs); i += 2 {
			if !has[pairs[i].Value] {
				has[pairs[i].Value] = true
				out = append(out, pairs[i], pairs[i+1])
			}
		}
		return true
	}
	for _, v := range merges {
		v, ok := p.resolve(v)
		if !ok {
			return nil, false
		}
		list := []*yaml.Node{v}
		if v.Kind == yaml.SequenceNode {
			list = v.Content
		}
		for _, m := range list {
			if !add(m) {
				return nil, false
			}
		}
	}
	return out, true
}

func (p *parser) str(v *yaml.Node, field string) string {
	if v.Kind != yaml.ScalarNode {
		p.errorf(v, "%s must be a string", field)
		return ""
	}
	if v.Tag == "!!null" {
		return ""
	}
	return v.Value
}

// yaml11Bools are the booleans of YAML 1.1, as envoyproxy/ratelimit's
// YAML library reads them (yes, on, …), beside YAML 1.2's true and false.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

func (p *parser) boolean(v *yaml.Node, field string) bool {
	var b bool
	if v.Kind == yaml.ScalarNode && v.Tag == "!!str" && v.Style == 0 {
		if b, ok := yaml11Bools[v.Value]; ok {
			return b
		}
	}
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&b) != nil {
		p.errorf(v, "%s must be true or false, not %q", field, v.Value)
	}
	return b
}

// parse reads one file into r: its domain, which no other file may have
// (from says which file has each).
func (r *Rules) parse(file string, data []byte, from map[string]string) []error {
	p := &parser{file: file, rules: r}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return []error{fmt.Errorf("%s: %w", file, err)}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return []error{fmt.Errorf("%s: empty: a file of envoyproxy/ratelimit's configuration is a domain and its descriptors", file)}
	}
	p.budget = max(maxRuleNodes, 4*countNodes(&doc))
	top := doc.Content[0]
	var domain string
	var domainNode, descs *yaml.Node
	p.fields(top, "a file's top level", topFields, func(key string, v *yaml.Node) {
		switch key {
		case "domain":
			domain, domainNode = p.str(v, "domain"), v
		case "descriptors":
			descs = v
		}
	})
	switch {
	case domain == "" && domainNode == nil:
		p.errorf(top, "no domain: each file is one domain (domain: <name>)")
	case domain == "":
		p.errorf(domainNode, "the domain is empty")
	case from[domain] != "":
		p.errorf(domainNode, "domain %q is also the domain of %s: one file per domain", domain, from[domain])
	}
	level := &ruleLevel{rules: map[string]*rule{}}
	if descs != nil {
		p.level(level, domain+".", descs)
	}
	if len(p.errs) == 0 {
		from[domain] = file
		r.domains[domain] = level
	}
	return p.errs
}

// level reads a list of descriptors into l; prefix is their parent's
// path and a dot.
func (p *parser) level(l *ruleLevel, prefix string, list *yaml.Node) {
	list, ok := p.resolve(list)
	if !ok || list.Kind == yaml.ScalarNode && list.Tag == "!!null" {
		return
	}
	if list.Kind != yaml.SequenceNode {
		p.errorf(list, "descriptors must be a list of descriptors (- key: …)")
		return
	}
	for _, n := range list.Content {
		if n, ok = p.resolve(n); !ok {
			return
		}
		p.descriptor(l, prefix, n)
	}
}

// descriptor reads one descriptor into l, checking it as
// envoyproxy/ratelimit does (and the fields it takes where it takes them).
func (p *parser) descriptor(l *ruleLevel, prefix string, n *yaml.Node) {
	var key, value string
	var rl, children *yaml.Node
	ru := &rule{ruleLevel: ruleLevel{rules: map[string]*rule{}}}
	var shadow, quota, detailed bool
	p.fields(n, "a descriptor", descriptorFields, func(field string, v *yaml.Node) {
		switch field {
		case "key":
			key = p.str(v, field)
		case "value":
			value = p.str(v, field)
		case "rate_limit":
			rl = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow = p.boolean(v, field)
		case "quota_mode":
			quota = p.boolean(v, field)
		case "detailed_metric":
			detailed = p.boolean(v, field)
		case "value_to_metric":
			ru.valueToMetric = p.boolean(v, field)
		case "share_threshold":
			ru.shareThreshold = p.boolean(v, field)
		}
	})
	if n.Kind != yaml.MappingNode {
		return
	}
	if key == "" {
		p.errorf(n, "a descriptor needs a key")
		return
	}
	final := key
	if value != "" {
		final += "_" + value
	}
	ru.path = prefix + final
	if _, dup := l.rules[final]; dup {
		p.errorf(n, "duplicate descriptor %s (key %q, value %q)", ru.path, key, value)
		return
	}
	wildcard := strings.HasSuffix(final, "*")
	if ru.shareThreshold && !wildcard {
		p.errorf(n, "share_threshold is for wildcard values (ending with '*'), and %s has none", ru.path)
	}
	if rl != nil {
		ru.limit = p.rateLimit(rl, ru.path, shadow, quota, detailed)
		if ru.limit != nil {
			p.rules.count++
		}
	}
	if children != nil {
		p.level(&ru.ruleLevel, ru.path+".", children)
	}
	if wildcard {
		l.wildcards = append(l.wildcards, final)
	}
	l.rules[final] = ru
}

// rateLimit reads a descriptor's rate_limit.
func (p *parser) rateLimit(n *yaml.Node, path string, shadow, quota, detailed bool) *ruleLimit {
	lim := &ruleLimit{path: path, shadow: shadow, quota: quota, detailedMetric: detailed}
	var unit string
	var unitNode *yaml.Node
	p.fields(n, "a rate_limit", rateLimitFields, func(field string, v *yaml.Node) {
		switch field {
		case "requests_per_unit":
			var u uint32 // as envoyproxy/ratelimit's YAML library reads it: 0x10 too
			if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || v.Decode(&u) != nil {
				p.errorf(v, "requests_per_unit must be a whole number from 0 to %d, not %q", uint32(math.MaxUint32), v.Value)
			}
			lim.requests = u
		case "unit":
			unit, unitNode = p.str(v, field), v
		case "unlimited":
			lim.unlimited = p.boolean(v, field)
		case "name":
			lim.name = p.str(v, field)
		case "replaces":
			if v.Kind != yaml.SequenceNode {
				p.errorf(v, "replaces must be a list of - name: <a rate_limit's name>")
				return
			}
			for _, e := range v.Content {
				var name string
				p.fields(e, "a replaces entry", replacesFields, func(_ string, nv *yaml.Node) { name = p.str(nv, "name") })
				if name == "" {
					p.errorf(e, "a replaces entry needs a name")
				}
				lim.replaces = append(lim.replaces, name)
			}
		}
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	for _, r := range lim.replaces {
		if r != "" && r == lim.name {
			p.errorf(n, "%s replaces its own name %q", path, r)
		}
	}
	u, known := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(unit)]
	valid := known && u != int32(rlsv3.RateLimitResponse_RateLimit_UNKNOWN)
	lim.unit = rlsv3.RateLimitResponse_RateLimit_Unit(u)
	at := n
	if unitNode != nil {
		at = unitNode
	}
	switch {
	case lim.unlimited && valid:
		p.errorf(at, "%s is unlimited: it takes no unit", path)
	case !lim.unlimited && !valid:
		p.errorf(at, "%s: invalid unit %q: use second, minute, hour, day, week, month or year", path, unit)
	case !lim.unlimited:
		lim.window = unitWindows[lim.unit]
		if lim.requests > 0 {
			lim.rate = fixedLimit(lim.requests, lim.window)
		}
	}
	return lim
}
