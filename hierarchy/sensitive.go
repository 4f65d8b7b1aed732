package hierarchy

import "strings"

// IsSensitive reports whether the tier's values are secrets, to be shown
// only as fingerprints: Sensitive when set, else whether its key reads a
// credential (CredentialKey). Valid after Tree.Compile.
func (tier *Tier) IsSensitive() bool { return tier.sensitive }

// credentialWords are the fragments of a header, cookie or query parameter
// name that mark its value as a credential, matched case-insensitively.
var credentialWords = []string{"auth", "key", "token", "secret", "pass", "cookie", "session", "jwt", "bearer", "credential", "signature"}

// CredentialKey reports whether a key template reads a credential: a
// request header, query parameter or cookie whose name holds one of
// credentialWords (Authorization, Proxy-Authorization, X-Api-Key, X-Jwt…),
// any cookie, the whole URI or query string (which may carry ?api_key=),
// or a variable ({http.vars.X}, {vars.X}: set by another handler, it may
// copy any of these) but Caddy's own client_ip. Both Caddy's placeholders ({http.request.header.X},
// {http.request.cookie.X}, {http.request.uri.query.X}) and the Caddyfile's
// shorthands ({header.X}, {cookie.X}, {query.X}) count.
func CredentialKey(key string) bool {
	for _, name := range placeholders(key) {
		name = strings.ToLower(name)
		name = strings.TrimPrefix(name, "http.request.")
		name = strings.TrimPrefix(name, "uri.")
		switch {
		case name == "cookie" || strings.HasPrefix(name, "cookie."):
			return true
		case name == "uri" || name == "orig_uri" || name == "query" || name == "orig_uri.query":
			return true
		case name == "http.vars.client_ip" || name == "vars.client_ip":
			// Caddy's own: the client's address (after trusted proxies),
			// which {client_ip} in a Caddyfile becomes.
		case strings.HasPrefix(name, "http.vars.") || strings.HasPrefix(name, "vars."):
			return true
		case strings.HasPrefix(name, "header."), strings.HasPrefix(name, "query."):
			_, field, _ := strings.Cut(name, ".")
			for _, w := range credentialWords {
				if strings.Contains(field, w) {
					return true
				}
			}
		}
	}
	return false
}

// placeholders returns the names of a template's placeholders, skipping
// escaped braces.
func placeholders(key string) []string {
	var names []string
	for rest := key; ; {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			return names
		}
		if open > 0 && rest[open-1] == '\\' {
			rest = rest[open+1:]
			continue
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return names
		}
		names = append(names, rest[open+1:open+end])
		rest = rest[open+end+1:]
	}
}

// Sensitive reports whether any tier of t is sensitive.
func (t *Tree) Sensitive() bool {
	for _, tier := range t.Tiers {
		if tier.sensitive {
			return true
		}
	}
	return false
}

// RedactKey rewrites a storage key of t ("{tree|tier=v}tier=v/tier=v#id",
// as Resolve writes it, or a prefix of one) with the escaped value of each
// segment of a sensitive tier replaced by show(escaped). A segment of a
// tier t does not have (a key of another configuration) is treated as
// sensitive: what cannot be told safe is not shown.
func (t *Tree) RedactKey(key string, show func(escaped string) string) string {
	var b strings.Builder
	b.Grow(len(key))
	rest := key
	if head, ok := strings.CutPrefix(rest, "{"+t.Name+"|"); ok {
		end := strings.IndexByte(head, '}')
		if end < 0 {
			return t.redactPath(key, show) // not a key of ours: every segment
		}
		b.WriteString("{" + t.Name + "|")
		b.WriteString(t.redactPath(head[:end], show))
		b.WriteByte('}')
		rest = head[end+1:]
	}
	id := ""
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		rest, id = rest[:i], rest[i:]
	}
	b.WriteString(t.redactPath(rest, show))
	b.WriteString(id)
	return b.String()
}

// redactPath redacts "tier=v/tier=v" (see RedactKey).
func (t *Tree) redactPath(path string, show func(string) string) string {
	segs := strings.Split(path, "/")
	for i, seg := range segs {
		name, v, ok := strings.Cut(seg, "=")
		if !ok {
			segs[i] = show(seg)
			continue
		}
		if tier := t.tierNamed(name); tier == nil || tier.sensitive {
			segs[i] = name + "=" + show(v)
		}
	}
	return strings.Join(segs, "/")
}

func (t *Tree) tierNamed(name string) *Tier {
	for _, tier := range t.Tiers {
		if tier.Name == name {
			return tier
		}
	}
	return nil
}
